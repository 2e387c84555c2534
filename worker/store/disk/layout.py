"""Where a session lives: ``<home>/sessions/<id>``, made durably, locked to open."""

from __future__ import annotations

import errno
import os
from typing import Final

from worker.store.disk import durable
from worker.store.disk.lock import lock_directory
from worker.store.errors import SessionIOError, SessionNotFound
from worker.store.session_id import validate_session_id

SESSIONS_DIR: Final = "sessions"
_EXISTS: Final = frozenset({errno.EEXIST})
_NO_DIR: Final = frozenset({errno.ENOENT, errno.ENOTDIR})


def session_dir(home: str | os.PathLike[str], session_id: str) -> str:
    """Return ``<home>/sessions/<id>`` after validating the id (before any path is built)."""
    validate_session_id(session_id)
    return os.path.join(os.fspath(home), SESSIONS_DIR, session_id)


def home_of(directory: str) -> str:
    """The home of a session's ``directory`` (``<home>/sessions/<id>``)."""
    return os.path.dirname(os.path.dirname(directory))


def lock_existing(directory: str) -> int:
    """Lock an existing session directory; SessionNotFound if it is not there."""
    try:
        return lock_directory(directory)
    except SessionIOError as exc:
        if exc.errno in _NO_DIR:
            raise SessionNotFound(directory) from exc
        raise


def ensure_sessions_dir(sessions: str) -> None:
    """Make ``<home>/sessions`` (and ``<home>``) if missing.

    The new names are made durable by the caller's fsync of ``sessions/`` and the home
    (``Session.create`` always does both, so a failed fsync here is redone there).
    """
    if os.path.isdir(sessions):
        return
    home = os.path.dirname(sessions)
    if not os.path.isdir(home):
        os.makedirs(home, mode=0o700, exist_ok=True)
    try:
        durable.mkdir(sessions)
    except SessionIOError as exc:
        if exc.errno not in _EXISTS:
            raise
