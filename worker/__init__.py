"""The session store and the worker process of loopd."""

from __future__ import annotations

from worker.baseline import Baseline
from worker.errors import (
    BaselineError,
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
from worker.records import (
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
from worker.session import Session

__all__ = [
    "Assistant",
    "Baseline",
    "BaselineError",
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
