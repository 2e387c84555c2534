"""A session's files between homes: durable copy, hashes, removal (the move's disk side).

Copies go through ``worker.durable`` (write whole, fsync, fsync the directory), so a
copy that a move verified is on disk when the move goes on.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from typing import Final

from worker.store.disk import durable
from worker.store.disk.durable import TMP_SUFFIX
from worker.store.disk.layout import SESSIONS_DIR, ensure_sessions_dir, session_dir

INCOMING_DIR: Final = "incoming"
"""``<home>/incoming/<id>``: a copy being made; never served, replaced by a rerun."""
RELEASED_DIR: Final = "released"
"""``<home>/released/<id>``: a moved-away copy on its way out."""
QUARANTINE_DIR: Final = "quarantine"
"""``<home>/quarantine/<id>.<why>``: a copy this node may no longer serve; kept, never served."""


def session_files(directory: str) -> list[str]:
    """The names of a session's durable files (temporaries left out), sorted."""
    return sorted(
        name
        for name in os.listdir(directory)
        if not name.endswith(TMP_SUFFIX) and os.path.isfile(os.path.join(directory, name))
    )


def file_hashes(directory: str) -> dict[str, str]:
    """SHA-256 of each durable file of a session directory, by name."""
    hashes = {}
    for name in session_files(directory):
        with open(os.path.join(directory, name), "rb") as f:
            hashes[name] = hashlib.sha256(f.read()).hexdigest()
    return hashes


def incoming_dir(home: str, session: str) -> str:
    """Where a copy of ``session`` is made in ``home`` before it is verified."""
    session_dir(home, session)  # validates the id before a path is built from it
    return os.path.join(home, INCOMING_DIR, session)


def copy_session(source: str, home: str, session: str) -> str:
    """Copy the session directory ``source`` to ``home``'s incoming area, durably; return it."""
    parent = os.path.join(home, INCOMING_DIR)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    target = incoming_dir(home, session)
    if os.path.exists(target):
        shutil.rmtree(target)  # a partial copy of an interrupted move
    durable.mkdir(target)
    for name in session_files(source):
        with open(os.path.join(source, name), "rb") as f:
            data = f.read()
        path = os.path.join(target, name)
        fd = durable.create(path)
        try:
            durable.write_all(fd, data, path)
            durable.fdatasync(fd, path)
        finally:
            durable.close(fd)
    durable.fsync_dir(target)
    durable.fsync_dir(parent)
    return target


def install_copy(home: str, session: str) -> str:
    """Rename a verified incoming copy to ``<home>/sessions/<id>``, durably; return its path."""
    sessions = os.path.join(home, SESSIONS_DIR)
    ensure_sessions_dir(sessions)
    target = session_dir(home, session)
    durable.rename(incoming_dir(home, session), target)
    durable.fsync_dir(sessions)
    durable.fsync_dir(os.path.join(home, INCOMING_DIR))
    return target


def set_aside(home: str, session: str, area: str, label: str) -> str:
    """Rename ``<home>/sessions/<id>`` to ``<home>/<area>/<id>.<label>``, durably; return it."""
    parent = os.path.join(home, area)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    target = os.path.join(parent, f"{session}.{label}")
    durable.rename(session_dir(home, session), target)
    durable.fsync_dir(os.path.join(home, SESSIONS_DIR))
    durable.fsync_dir(parent)
    return target


def remove_released(home: str, session: str, label: str) -> None:
    """Move ``<home>/sessions/<id>`` out of service, then delete it (the end of a move)."""
    if os.path.isdir(session_dir(home, session)):
        set_aside(home, session, RELEASED_DIR, label)
    released = os.path.join(home, RELEASED_DIR, f"{session}.{label}")
    if os.path.isdir(released):
        shutil.rmtree(released)
        durable.fsync_dir(os.path.join(home, RELEASED_DIR))
