"""A session's files between homes: durable copy, hashes, removal (the move's disk side).

Copies go through ``worker.store.disk.durable`` (write whole, fsync, fsync the directory), so a
copy that a move verified is on disk when the move goes on. A session's tenant, kept
by its home in ``<home>/tenants/<id>``, travels inside the session's directory as
``tenant`` (``carry_tenant`` at the seal): it is one of the sealed files, hashed, sent
and checked with the others, and the target's ``adopt`` reads it (``carried_tenant``).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
from typing import Final

from supervisor.cluster.errors import MoveFailed
from worker.ipc.tls_roles import RESERVED_TENANT, TENANT_NAME
from worker.store.disk import durable
from worker.store.disk.durable import TMP_SUFFIX
from worker.store.disk.layout import SESSIONS_DIR, ensure_sessions_dir, session_dir
from worker.store.errors import SessionError, SessionIOError

INCOMING_DIR: Final = "incoming"
"""``<home>/incoming/<id>``: a copy being made; never served, replaced by a rerun."""
RELEASED_DIR: Final = "released"
"""``<home>/released/<id>``: a moved-away copy on its way out."""
TENANTS_DIR: Final = "tenants"
"""``<home>/tenants/<id>``: the session's tenant, the home's own record (a newline ends it)."""
TENANT_FILE: Final = "tenant"
"""``<session dir>/tenant``: the tenant a move carries, written at the seal."""
MAX_TENANT_FILE: Final = 4096
_ABSENT: Final = frozenset({errno.ENOENT})
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


def read_tenant(path: str) -> str | None:
    """The tenant a tenant file names; None if there is none, or it is not a regular
    file, unreadable, too long or not a tenant's name: a damaged file gives a session to
    no tenant (the operator's)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO, a device: not read
            return None
        raw = os.read(fd, MAX_TENANT_FILE + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        name = raw.decode("utf-8").removesuffix("\n")
    except UnicodeDecodeError:
        return None
    good = len(raw) <= MAX_TENANT_FILE and TENANT_NAME.fullmatch(name) is not None
    return name if good and name != RESERVED_TENANT else None


def carry_tenant(home: str, session: str) -> None:
    """Write the session's tenant (``<home>/tenants/<id>``) into its directory as
    ``tenant``, durably, or remove that file if the session is the operator's: what the
    seal seals and a move sends. MoveFailed if it cannot be written."""
    try:
        _carry_tenant(home, session)
    except (SessionError, OSError) as exc:
        raise MoveFailed(session, "seal", f"cannot carry its tenant: {exc}") from exc


def _carry_tenant(home: str, session: str) -> None:
    directory = session_dir(home, session)
    tenant = read_tenant(os.path.join(home, TENANTS_DIR, session))
    path = os.path.join(directory, TENANT_FILE)
    if tenant is not None:
        if read_tenant(path) != tenant:
            durable.write_file_atomic(path, tenant.encode("utf-8") + b"\n")
        return
    try:
        os.unlink(path)
    except OSError as exc:
        if exc.errno not in _ABSENT:
            raise SessionIOError(path, exc.errno or 0, "unlink") from exc
        return
    durable.fsync_dir(directory)


def carried_tenant(home: str, session: str) -> str | None:
    """The tenant a session moved here carried (its directory's ``tenant``), or None."""
    return read_tenant(os.path.join(session_dir(home, session), TENANT_FILE))
