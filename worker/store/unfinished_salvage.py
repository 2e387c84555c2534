"""Open's first check: an interrupted salvage's plan in the session directory.

The plan itself (what a salvage cuts, its bytes) is ``worker.offline.salvage_plan``; open,
verify and backup only ask whether one is there, and refuse the session if so, without
loading it (issue 32: every interpreter that opens a session imports this module).
"""

from __future__ import annotations

import errno
import os
from typing import Final

from worker.store.disk.files import Directory
from worker.store.disk.layout import home_of
from worker.store.errors import PathError, SessionIOError

PLAN_NAME: Final = "salvage.plan"
_ABSENT: Final = frozenset({errno.ENOENT})


class UnfinishedSalvage(PathError):
    """An interrupted salvage left its plan in the session directory; rerun salvage."""


def plan_present(directory: str, dir_fd: Directory) -> bool:
    """Whether the session directory holds an unfinished salvage's plan."""
    if not isinstance(dir_fd, int):
        return PLAN_NAME in dir_fd.names()  # salvage is of files; another backend has none
    try:
        os.stat(PLAN_NAME, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in _ABSENT:
            return False
        raise SessionIOError(os.path.join(directory, PLAN_NAME), exc.errno or 0, "stat") from exc
    return True


def refuse_unfinished_salvage(directory: str, dir_fd: Directory) -> None:
    """Refuse a session an interrupted salvage left half cut (UnfinishedSalvage).

    Open and verify call this first: such a session may show a gap in its epochs, or
    worse none, and a worker appending to it would have its work cut by the rerun.
    """
    if plan_present(directory, dir_fd):
        raise UnfinishedSalvage(os.path.join(directory, PLAN_NAME), unfinished_why(directory))


def unfinished_why(directory: str) -> str:
    """The one line that sends the operator to finish an interrupted salvage."""
    home = home_of(directory)
    session_id = os.path.basename(directory)
    return (
        "an interrupted `loopd salvage` left its plan here: the session is half cut "
        "(some of what it cuts may be in quarantine already). Finish it: "
        f"loopd salvage --home {home} {session_id} (it lists everything the plan cuts)"
    )
