"""The daemon's derived file per session with schedules: ``<home>/schedules/<id>.json``.

``{"live": bool, "pending": n, "next": time or null}``. The session's log is the truth;
this file lets the daemon arm a timer for a hibernated session without waking it. It
is written before a worker starts (``live``: the worker may change the schedules, so
the file may fall behind) and after each change the worker reports; ``live`` is cleared
only after the worker's clean exit, whose last answer carried the final state. At
start the daemon wakes every session whose file says ``live`` (its worker reports the
truth at open) and arms a timer for every other one's ``next``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Final

from worker.store.disk import durable
from worker.store.schedules import parse_time

SCHEDULES_DIR: Final = "schedules"
MAX_FILE_BYTES: Final = 4096


@dataclass(frozen=True, slots=True)
class Derived:
    """What the daemon knows of a session's schedules."""

    live: bool
    pending: int
    next: str | None

    def due_in(self, now: float) -> float | None:
        """Seconds until the next delivery should be tried (0: now), None if never."""
        if self.live:
            return 0.0
        when = parse_time(self.next) if self.next is not None else None
        return None if when is None else max(0.0, when - now)


def derived_path(home: str, session_id: str) -> str:
    return os.path.join(home, SCHEDULES_DIR, f"{session_id}.json")


def write_derived(home: str, session_id: str, derived: Derived) -> None:
    """Write the session's file atomically and durably (SessionIOError if it fails)."""
    directory = os.path.join(home, SCHEDULES_DIR)
    if not os.path.isdir(directory):
        durable.mkdir(directory)
        durable.fsync_dir(home)
    if derived.pending == 0 and not derived.live:
        try:
            os.unlink(derived_path(home, session_id))
        except FileNotFoundError:
            return
        durable.fsync_dir(directory)
        return
    data = {"live": derived.live, "pending": derived.pending, "next": derived.next}
    durable.write_file_atomic(
        derived_path(home, session_id), (json.dumps(data, sort_keys=True) + "\n").encode()
    )


def derived_sessions(home: str) -> list[str]:
    """The sessions that have a derived file (none when the folder does not exist)."""
    try:
        names = os.listdir(os.path.join(home, SCHEDULES_DIR))
    except FileNotFoundError:
        return []
    return sorted(n.removesuffix(".json") for n in names if n.endswith(".json"))


def read_derived(home: str, session_id: str) -> Derived | None:
    """The session's file, None when absent; a file that does not parse reads as live."""
    try:
        with open(derived_path(home, session_id), "rb") as file:
            raw = file.read(MAX_FILE_BYTES)
    except FileNotFoundError:
        return None
    except OSError:
        return Derived(live=True, pending=0, next=None)  # unreadable: ask the worker
    try:
        data = json.loads(raw)
        live, pending, when = data["live"], data["pending"], data["next"]
    except (ValueError, TypeError, KeyError):
        return Derived(live=True, pending=0, next=None)
    if (
        type(live) is not bool
        or type(pending) is not int
        or not (when is None or type(when) is str)
    ):
        return Derived(live=True, pending=0, next=None)
    return Derived(live=live, pending=pending, next=when)


def reported_summary(home: str, session_id: str) -> list[object] | None:
    """``[pending, next due]`` as the session's file has it; None without a file."""
    derived = read_derived(home, session_id)
    return None if derived is None else [derived.pending, derived.next]


def derived_of(summary: object, *, live: bool) -> Derived | None:
    """A worker's ``[pending, next]`` summary as a Derived; None if it is not one."""
    if not (isinstance(summary, list) and len(summary) == 2):
        return None
    pending, when = summary
    if type(pending) is not int or not (when is None or type(when) is str):
        return None
    return Derived(live=live, pending=pending, next=when)
