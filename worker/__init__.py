"""The worker process of loopd (``python -m worker``), and the store's public names.

The session store lives in ``worker.store``; its names are re-exported here so that
``from worker import Session`` keeps working.
They are imported on first use, not with the package: ``import worker.ipc.wire`` (every
client, every CLI command) then loads the wire format alone, not the whole store.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from worker.store import (
        Assistant,
        Baseline,
        BaselineError,
        ChecksumMismatch,
        EpochClosed,
        EpochEnd,
        Handoff,
        InvalidLog,
        InvalidRecord,
        InvalidSessionId,
        KeyExpired,
        LogError,
        LogSealed,
        NotOwnerNow,
        Owner,
        PathError,
        Record,
        Session,
        SessionBroken,
        SessionError,
        SessionExists,
        SessionIOError,
        SessionLocked,
        SessionNotFound,
        SessionStart,
        ToolResult,
        TornLog,
        Usage,
        User,
    )

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
    "Usage",
    "User",
]
_SOURCES: Final = dict.fromkeys(__all__, "worker.store")


def __getattr__(name: str) -> object:
    """Import the module of a re-exported name on its first use, then keep the name here.

    A client needs ``worker.ipc.wire``; importing the package must not load the store for it
    (issue 32).
    """
    module = _SOURCES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
