"""Rebuild a session's key index files from its logs, on an operator's request only.

The key index is derived from the logs (``worker.store.key_index``). A file that is
missing or damaged makes open refuse the session (``KeyIndexFileError``): nothing it
says is trusted. ``loopd repair ID`` then reads every epoch, checks the whole history
as ``loopd verify`` does, rebuilds the index, and writes a file only when the rebuilt
index is exactly the one the newest SessionStart names (same ranges, same digests):
anything else is damage to the logs themselves, which is never repaired.
"""

from __future__ import annotations

import os

from worker.offline.repair import RepairRefused
from worker.store.disk import durable
from worker.store.disk.layout import session_dir
from worker.store.disk.lock import lock_directory, unlock_directory
from worker.store.errors import KeyIndexFileError, SessionError, SessionLocked
from worker.store.key_index import write_segments
from worker.store.loader import load_session


def key_index_damaged(home: str | os.PathLike[str], session_id: str) -> KeyIndexFileError | None:
    """Why open refuses the session's key index files, or None if it does not."""
    directory = session_dir(home, session_id)
    try:
        load_session(directory, session_id)
    except KeyIndexFileError as exc:
        return exc
    except SessionError:
        return None  # refused for another reason (a torn log, say): not the index's to mend
    return None


def rebuild_key_index(home: str | os.PathLike[str], session_id: str) -> list[str]:
    """Rewrite the key index files the newest SessionStart names, from the logs; their paths."""
    directory = session_dir(home, session_id)
    try:
        lock_fd = lock_directory(directory)
    except SessionLocked as exc:
        holder = f"pid {exc.pid}" if exc.pid is not None else "another process"
        raise RepairRefused(
            directory,
            f"the session is held by {holder}; stop its worker first (loopd stop {session_id})",
        ) from exc
    try:
        state = load_session(directory, session_id, dir_fd=lock_fd, history=True, index_files=False)
        segments = state.key_index.segments
        write_segments(directory, segments)
        durable.fsync_dir(directory)
        load_session(directory, session_id, dir_fd=lock_fd)  # the session must open now
    finally:
        unlock_directory(lock_fd)
    return [os.path.join(directory, segment.name) for segment in segments]
