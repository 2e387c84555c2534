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
    PathError,
    SessionBroken,
    SessionError,
    SessionExists,
    SessionIOError,
    SessionLocked,
    SessionNotFound,
    TornLog,
)
from worker.records import Assistant, EpochEnd, Record, SessionStart, ToolResult, Usage, User
from worker.session import Session

__all__ = [
    "Assistant",
    "Baseline",
    "BaselineError",
    "EpochClosed",
    "EpochEnd",
    "InvalidLog",
    "InvalidRecord",
    "InvalidSessionId",
    "KeyExpired",
    "LogError",
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
