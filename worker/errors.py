"""Deprecated: ``worker.errors`` moved to ``worker.store.errors``; import from ``worker.app``.

Kept for one release so that an App written before ``worker/store/`` still imports; the
import warns (DeprecationWarning) at the App's line. docs/apps.md lists the public names.
"""

from __future__ import annotations

from worker.app import warn_moved
from worker.store.errors import (
    LOG_REFUSED,
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
    UnsafeFile,
    quote,
)

warn_moved("worker.errors")

__all__ = [
    "LOG_REFUSED",
    "BaselineError",
    "ChecksumMismatch",
    "EpochClosed",
    "InvalidLog",
    "InvalidRecord",
    "InvalidSessionId",
    "KeyExpired",
    "LogError",
    "LogSealed",
    "NotOwnerNow",
    "PathError",
    "SessionBroken",
    "SessionError",
    "SessionExists",
    "SessionIOError",
    "SessionLocked",
    "SessionNotFound",
    "TornLog",
    "UnsafeFile",
    "quote",
]
