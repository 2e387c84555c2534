"""The PostgreSQL backend's durable boundaries, and the one hook a fault rig may install there.

Every fenced write reaches two points: ``BEFORE_COMMIT`` (its statements were sent, the
transaction is open, nothing of it is visible yet; a group commit's BEGIN and INSERT are
pipelined, so the server runs them as they arrive and holds the session's row from then
on) and ``AFTER_COMMIT`` (COMMIT returned, the caller has not been told). The file
store's equivalent is ``worker.store.disk.durable``'s hook. A hook may block, sleep, kill its
process or raise a driver error (the backend then takes it as the database's: before
COMMIT the write is rolled back; after it the outcome is unknown to the caller, as when
COMMIT's reply is lost).
"""

from __future__ import annotations

import enum
from typing import Protocol


class Point(enum.Enum):
    """Where in a fenced write's transaction the hook is called."""

    BEFORE_COMMIT = "before-commit"
    AFTER_COMMIT = "after-commit"


class CommitHook(Protocol):
    """Called at each boundary with the point and the server process of the connection."""

    def __call__(self, point: Point, backend_pid: int) -> None: ...


_hook: CommitHook | None = None


def set_hook(hook: CommitHook | None) -> CommitHook | None:
    """Install ``hook`` for this process (None: none); return the previous one."""
    global _hook
    previous, _hook = _hook, hook
    return previous


def reach(point: Point, backend_pid: int) -> None:
    """Call the hook, if one is installed, at ``point``."""
    if _hook is not None:
        _hook(point, backend_pid)
