"""The worker process of loopd (``python -m worker``), and the store's public names.

The session store lives in ``worker.store``; its names are re-exported here so that
``from worker import Session`` keeps working.
"""

from __future__ import annotations

from worker.store import (
    Assistant,
    Baseline,
    BaselineError,
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
