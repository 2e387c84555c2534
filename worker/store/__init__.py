"""The session store: records, durable I/O, open/append/commit, repair and inspection.

It imports nothing else of loopd (import-linter checks it): the worker process, the
supervisor and the chaos rig build on it, never the other way round. The names below
are imported on first use: ``worker.store.errors`` alone (what the wire format needs)
does not load the records, open and append.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from worker.store.baseline import Baseline
    from worker.store.errors import (
        BaselineError,
        ChecksumMismatch,
        EpochClosed,
        InvalidLog,
        InvalidRecord,
        InvalidSessionId,
        KeyExpired,
        LogError,
        LogSealed,
        NotOwnerNow,
        PathError,
        SessionBroken,
        SessionError,
        SessionExists,
        SessionIOError,
        SessionLocked,
        SessionNotFound,
        TornLog,
    )
    from worker.store.format.records import (
        Assistant,
        EpochEnd,
        Handoff,
        Owner,
        Record,
        Schedule,
        SessionStart,
        ToolResult,
        Unschedule,
        Usage,
        User,
    )
    from worker.store.session import Session

__all__ = [
    "Assistant",
    "Baseline",
    "BaselineError",
    "ChecksumMismatch",
    "EpochClosed",
    "EpochEnd",
    "Handoff",
    "InvalidLog",
    "InvalidRecord",
    "InvalidSessionId",
    "KeyExpired",
    "LogError",
    "LogSealed",
    "NotOwnerNow",
    "Owner",
    "PathError",
    "Record",
    "Schedule",
    "Session",
    "SessionBroken",
    "SessionError",
    "SessionExists",
    "SessionIOError",
    "SessionLocked",
    "SessionNotFound",
    "SessionStart",
    "ToolResult",
    "TornLog",
    "Unschedule",
    "Usage",
    "User",
]
_SOURCES: Final = {  # each re-exported name and the module that defines it
    "Baseline": "worker.store.baseline",
    "BaselineError": "worker.store.errors",
    "ChecksumMismatch": "worker.store.errors",
    "EpochClosed": "worker.store.errors",
    "InvalidLog": "worker.store.errors",
    "InvalidRecord": "worker.store.errors",
    "InvalidSessionId": "worker.store.errors",
    "KeyExpired": "worker.store.errors",
    "LogError": "worker.store.errors",
    "LogSealed": "worker.store.errors",
    "NotOwnerNow": "worker.store.errors",
    "PathError": "worker.store.errors",
    "SessionBroken": "worker.store.errors",
    "SessionError": "worker.store.errors",
    "SessionExists": "worker.store.errors",
    "SessionIOError": "worker.store.errors",
    "SessionLocked": "worker.store.errors",
    "SessionNotFound": "worker.store.errors",
    "TornLog": "worker.store.errors",
    "Assistant": "worker.store.format.records",
    "EpochEnd": "worker.store.format.records",
    "Handoff": "worker.store.format.records",
    "Owner": "worker.store.format.records",
    "Record": "worker.store.format.records",
    "Schedule": "worker.store.format.records",
    "Unschedule": "worker.store.format.records",
    "SessionStart": "worker.store.format.records",
    "ToolResult": "worker.store.format.records",
    "Usage": "worker.store.format.records",
    "User": "worker.store.format.records",
    "Session": "worker.store.session",
}


def __getattr__(name: str) -> object:
    """Import the module of a re-exported name on its first use, then keep the name here.

    Every module of the store imports this package first; loading all of it for
    ``worker.store.errors`` cost a client most of its start (issue 32).
    """
    module = _SOURCES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
