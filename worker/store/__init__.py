"""The session store: records, durable I/O, open/append/commit, repair and inspection.

It imports nothing else of loopd (import-linter checks it): the worker process, the
supervisor and the chaos rig build on it, never the other way round.
"""

from __future__ import annotations

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
from worker.store.records import (
    Assistant,
    EpochEnd,
    Handoff,
    Owner,
    Record,
    SessionStart,
    ToolResult,
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
