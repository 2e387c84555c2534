"""The target's side of a takeover between hosts: files pushed by the operator, checked.

``receive`` writes one chunk of one file into ``<home>/incoming/<id>/`` (the first chunk
of a takeover, ``first``, clears what an earlier attempt left); ``install`` checks the
files against the operator's manifest (the same names, sizes and SHA-256), fdatasyncs
each, fsyncs the directory and its parent, renames it to ``sessions/<id>`` and opens it
once, refusing a torn or invalid copy before anything is owned. Both refuse while etcd
names an owner or a move of the session, or while this node holds a copy of it.
"""

from __future__ import annotations

import os
import shutil

from supervisor.cluster.errors import MoveFailed
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import move_key
from supervisor.cluster.ownership import owner_of
from supervisor.moves.session_files import INCOMING_DIR, file_hashes, incoming_dir, install_copy
from worker import Session, SessionError
from worker.store.disk import durable
from worker.store.disk.layout import session_dir


def _check_free(client: EtcdClient, home: str, session: str) -> None:
    owner = owner_of(client, session)
    if owner is not None:
        raise MoveFailed(session, "takeover", f"{owner.node} owns it: not taken over")
    if client.get(move_key(session)) is not None:
        raise MoveFailed(session, "takeover", "a move of it is in progress")
    if os.path.isdir(session_dir(home, session)):
        raise MoveFailed(session, "takeover", "this node holds a copy of it already")


def _name(session: str, name: object) -> str:
    if not isinstance(name, str) or not name or os.sep in name or name.startswith("."):
        raise MoveFailed(session, "takeover", f"a file name {name!r} that is not a session's")
    return name


def receive_here(
    client: EtcdClient, home: str, session: str, fields: dict[str, object]
) -> dict[str, object]:
    """Write one pushed chunk (``name``, ``offset``, ``data``, ``first``)."""
    name, offset, data = (
        _name(session, fields.get("name")),
        fields.get("offset"),
        fields.get("data"),
    )
    if type(offset) is not int or offset < 0 or not isinstance(data, bytes):
        raise MoveFailed(session, "takeover", "a chunk needs an offset >= 0 and bytes")
    target = incoming_dir(home, session)
    if fields.get("first") is True:
        _check_free(client, home, session)
        os.makedirs(os.path.join(home, INCOMING_DIR), mode=0o700, exist_ok=True)
        if os.path.exists(target):
            shutil.rmtree(target)
        durable.mkdir(target)
    path = os.path.join(target, name)
    if not os.path.isdir(target) or (offset > 0 and not os.path.isfile(path)):
        raise MoveFailed(session, "takeover", f"{name}: a chunk at {offset} with no file begun")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if offset == 0 else 0), 0o600)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)
    return {"session": session, "name": name, "end": offset + len(data)}


def install_here(
    client: EtcdClient, home: str, session: str, fields: dict[str, object]
) -> dict[str, object]:
    """Check the pushed files against ``files`` (the manifest), make them durable, install."""
    _check_free(client, home, session)
    files = fields.get("files")
    if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
        raise MoveFailed(session, "takeover", "install needs the files' manifest")
    expected = {_name(session, f.get("name")): str(f.get("sha256")) for f in files}
    copy = incoming_dir(home, session)
    found = file_hashes(copy) if os.path.isdir(copy) else {}
    if found != expected:
        differ = sorted(
            n for n in found.keys() | expected.keys() if found.get(n) != expected.get(n)
        )
        raise MoveFailed(
            session, "verify", f"the pushed copy differs from the manifest in {differ}"
        )
    for name in expected:
        path = os.path.join(copy, name)
        fd = durable.open_append(path)
        try:
            durable.fdatasync(fd, path)
        finally:
            durable.close(fd)
    durable.fsync_dir(copy)
    durable.fsync_dir(os.path.dirname(copy))
    installed = install_copy(home, session)
    try:
        Session.open(home, session).close()  # refuse a torn or invalid copy before owning it
    except SessionError as exc:
        shutil.rmtree(installed)
        raise MoveFailed(session, "takeover", f"the copy is refused: {exc}") from exc
    return {"session": session, "files": len(expected)}
