"""Rebuild a missing epoch-0 baseline from the App, only when its hash proves it the same.

Epoch 0's baseline is what the App's ``initial_baseline`` made when the session was
created, and ``SessionStart.baseline`` of ``0.jsonl`` holds the SHA-256 of its exact
bytes. If the file is gone, the App can make it again: it is written back only when
the bytes the App gives now hash to that value (the same App, unchanged); anything
else is refused, and nothing is written. Later epochs' baselines come from the App's
compaction of what the session held and cannot be made again: restore those.
"""

from __future__ import annotations

import os

from worker.store.baseline import Baseline
from worker.store.disk import durable
from worker.store.disk.files import read_file
from worker.store.disk.layout import lock_existing, session_dir
from worker.store.disk.lock import unlock_directory
from worker.store.errors import PathError, SessionError, SessionLocked
from worker.store.format.records import SessionStart, decode_line
from worker.store.loader import baseline_path, load_session, log_path


class RebuildRefused(PathError):
    """The baseline is not rebuilt; ``why`` says why and what to do instead."""


def rebuild_baseline(
    home: str | os.PathLike[str], session_id: str, baseline: Baseline
) -> tuple[str, str | None]:
    """Write ``baseline`` as epoch 0's if it is missing and hashes as SessionStart says.

    Returns its path and what the loader still refuses of the session, if anything.
    """
    directory = session_dir(home, session_id)
    try:
        lock_fd = lock_existing(directory)
    except SessionLocked as exc:
        raise RebuildRefused(
            directory, f"the session is held by a worker; stop it first (loopd stop {session_id})"
        ) from exc
    try:
        path = baseline_path(directory, 0)
        if os.path.lexists(path):
            raise RebuildRefused(path, "is there: nothing to rebuild (only a missing one is)")
        log = log_path(directory, 0)
        data = read_file(lock_fd, os.path.basename(log), log)
        try:
            first, _part = decode_line(data.split(b"\n", 1)[0])
        except ValueError as exc:
            raise RebuildRefused(f"{log}:1", f"undecodable SessionStart: {exc}") from exc
        if not isinstance(first, SessionStart):
            raise RebuildRefused(f"{log}:1", "the first record is not a SessionStart")
        made = baseline.hash()
        if made != first.baseline:
            raise RebuildRefused(
                path,
                f"the App's initial baseline hashes to {made}, SessionStart.baseline says "
                f"{first.baseline}: not the baseline this session was created with, so it is "
                "not written. Pass --app for the App the session was created with, or "
                "restore the session from a backup",
            )
        durable.write_file_atomic(path, baseline.to_json())
        try:
            load_session(directory, session_id, dir_fd=lock_fd, history=True)
        except SessionError as exc:
            return path, str(exc)
        return path, None
    finally:
        unlock_directory(lock_fd)
