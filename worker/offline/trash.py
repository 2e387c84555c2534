"""Moving a session's directory out of ``sessions/``: to ``<home>/trash/``, never removed.

``loopd delete`` (and ``loopd restore --force`` over a session that is there) move the
directory, whole, to ``<home>/trash/<id>.<UTC time>``, under the session's lock, so
that no worker holds it while it moves; the rename is made durable in both
directories. An operator empties the trash by hand when sure.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final

from worker.offline.repair import make_dirs
from worker.store.disk import durable
from worker.store.disk.layout import lock_existing, session_dir
from worker.store.disk.lock import unlock_directory
from worker.store.disk.scan_file import forget_summary

TRASH_DIR: Final = "trash"


def stamp() -> str:
    """A UTC time for a name: sortable, no characters a shell or a session id minds."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")


def move_to_trash(
    home: str | os.PathLike[str],
    session_id: str,
    check: Callable[[str], None] | None = None,
) -> str:
    """Move ``<home>/sessions/<id>`` to ``<home>/trash/<id>.<time>``; return where it went.

    SessionNotFound if it is not there, SessionLocked while a worker holds it. ``check``
    is called with the directory under its lock, before the move, and may refuse it by
    raising (restore's check that the work it drops is the work the operator confirmed).
    """
    directory = session_dir(home, session_id)
    lock_fd = lock_existing(directory)
    try:
        if check is not None:
            check(directory)
        trash = os.path.join(os.fspath(home), TRASH_DIR)
        make_dirs(trash)
        target = os.path.join(trash, f"{session_id}.{stamp()}")
        durable.rename(directory, target)
        durable.fsync_dir(os.path.dirname(directory))
        durable.fsync_dir(trash)
        forget_summary(home, session_id)  # a cache of the log that left (docs/format.md)
    finally:
        unlock_directory(lock_fd)
    return target
