"""The daemon's home: made private and locked at start, and the sessions found in it."""

from __future__ import annotations

import os

from supervisor.control_socket import make_private_dirs
from supervisor.errors import HomeLocked, ServeError
from worker.store.disk.layout import SESSIONS_DIR
from worker.store.disk.lock import lock_directory
from worker.store.errors import InvalidSessionId, SessionIOError, SessionLocked
from worker.store.session_id import validate_session_id


def claim_home(home: str) -> int:
    """Make the home (0700 whatever the umask) and take its lock; return the lock's fd."""
    sessions = os.path.join(home, SESSIONS_DIR)
    try:
        make_private_dirs(home)
        make_private_dirs(sessions)
        return lock_directory(home)
    except SessionLocked as exc:
        raise HomeLocked(home, exc.pid) from exc
    except SessionIOError as exc:
        raise ServeError(f"{exc}; choose a directory you own on a local file system") from exc
    except OSError as exc:
        raise ServeError(
            f"{exc.filename or home}: cannot use this home: {exc.strerror}; "
            "choose a directory you own on a local file system"
        ) from exc


def existing_sessions(home: str) -> list[str]:
    """The session ids of the home's session directories, sorted."""
    found = []
    for name in sorted(os.listdir(os.path.join(home, SESSIONS_DIR))):
        try:
            found.append(validate_session_id(name))
        except InvalidSessionId:
            continue  # not a session directory (the operator's own files)
    return found
