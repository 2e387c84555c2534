"""A move's steps as the nodes make them when they share nothing (docs/scaling.md 6).

Across hosts the mover reaches no home: it asks each node over the transport, and each
node acts on its own disk only after reading the move from etcd itself (never on what
the mover says): the source seals (``seal_here``) and later removes its copy
(``release_here``); the target pulls the files from the source node over mutual TLS
(``pull_here``): the source's manifest first (name, size, SHA-256 of each file), then
each file in chunks, written to ``<home>/incoming/<id>/``, its SHA-256 and size checked,
fdatasynced, the directory fsynced, then installed as ``sessions/<id>`` exactly as a
local move does. The source serves the files of a session only once its log is sealed
for the node asking (``sealed_manifest``: its ``Handoff`` names the node of the peer's
certificate), and only to a node certificate.

That check reads and verifies the whole log (as an open does: most of a pull's time),
and the seal made moments before has just done the same. So the seal, while it still
holds the session's lock, notes the SHA-256 of each file of the copy it sealed and for
which node (``_SEALED``, in the daemon's memory); the manifest, which hashes every file
anyway, takes the seal's word only when the same files have the same hashes, the very
bytes the seal verified and sealed, and reads the log again otherwise (another seal, a
daemon restarted since, an abort's ``Owner`` appended, any change at all).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from typing import Final

from supervisor.cluster.errors import ClusterError, MoveFailed
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import move_key
from supervisor.cluster.ownership import owner_of, placement_of
from supervisor.cluster.peer_link import NodeLink
from supervisor.cluster.routing import node_address
from supervisor.cluster.transport import TlsFiles
from supervisor.errors import ControlError
from supervisor.moves.move import MoveIntent, seal_source
from supervisor.moves.session_files import (
    INCOMING_DIR,
    file_hashes,
    incoming_dir,
    install_copy,
    remove_released,
    session_files,
)
from worker import SessionError
from worker.ipc.wire import Message, WireError, error, ok
from worker.store.disk import durable
from worker.store.disk.layout import session_dir
from worker.store.loader import load_session

CHUNK: Final = 512 << 10
"""Bytes of a file per ``file`` request (a reply frame holds at most 1 MiB)."""
PULL_TIMEOUT: Final = 30.0
_SEALED: dict[str, tuple[str, dict[str, str]]] = {}
"""A copy this node sealed, by its directory: the node it is sealed for and each file's
SHA-256 when it was sealed (under the session's lock)."""
_GRANTED: dict[str, tuple[str, dict[str, int]]] = {}
"""A copy whose manifest was served, by its directory: the node it is sealed for and each
file's size in that manifest; a ``file`` request reads only within them."""
_SEALED_LOCK = threading.Lock()
_SEALED_AT_MOST: Final = 256
"""Seals remembered at once (each is dropped when its copy is released or discarded)."""


def _remember_seal(directory: str, to: str) -> None:
    hashes = file_hashes(directory)
    with _SEALED_LOCK:
        _SEALED.pop(directory, None)
        while len(_SEALED) >= _SEALED_AT_MOST:
            del _SEALED[next(iter(_SEALED))]
        _SEALED[directory] = (to, hashes)


def _forget_seal(directory: str) -> None:
    with _SEALED_LOCK:
        _SEALED.pop(directory, None)
        _GRANTED.pop(directory, None)


def _intent(client: EtcdClient, session: str, step: str) -> MoveIntent:
    kv = client.get(move_key(session))
    if kv is None:
        raise MoveFailed(session, step, "no move of it is in progress in etcd")
    return MoveIntent.decode(session, kv.value)


def seal_here(client: EtcdClient, node: str, home: str, session: str) -> dict[str, object]:
    """The source's step 2: append ``Handoff`` to its own copy (its worker stopped)."""
    intent = _intent(client, session, "seal")
    if intent.source != node:
        raise MoveFailed(session, "seal", f"the move in etcd is from {intent.source}, not {node}")
    directory = session_dir(home, session)
    seal_source(intent, home, sealed=lambda: _remember_seal(directory, intent.target))
    return {"session": session, "sealed_for": intent.target, "token": intent.token}


def sealed_manifest(home: str, session: str, peer_names: list[str]) -> list[dict[str, object]]:
    """The files a peer node may pull: only of a copy sealed for one of ``peer_names``."""
    directory = session_dir(home, session)
    if not os.path.isdir(directory):
        raise MoveFailed(session, "copy", "no copy of it on this node")
    files: list[dict[str, object]] = []
    for name in session_files(directory):
        digest = hashlib.sha256()
        with open(os.path.join(directory, name), "rb") as f:
            while block := f.read(CHUNK):
                digest.update(block)
            size = f.tell()
        files.append({"name": name, "size": size, "sha256": digest.hexdigest()})
    with _SEALED_LOCK:
        remembered = _SEALED.get(directory)
    if remembered is not None and remembered[1] == {f["name"]: f["sha256"] for f in files}:
        sealed_for: str | None = remembered[0]  # the bytes the seal verified and sealed
    else:
        fence = load_session(directory, session).fence
        sealed_for = fence.sealed.to if fence.sealed is not None else None
    if sealed_for not in peer_names:
        with _SEALED_LOCK:
            _GRANTED.pop(directory, None)
        raise MoveFailed(session, "copy", f"its log is not sealed for {', '.join(peer_names)}")
    with _SEALED_LOCK:
        while directory not in _GRANTED and len(_GRANTED) >= _SEALED_AT_MOST:
            del _GRANTED[next(iter(_GRANTED))]
        _GRANTED[directory] = (sealed_for, {str(f["name"]): int(str(f["size"])) for f in files})
    return files


def read_chunk(
    home: str, session: str, name: str, offset: int, peer_names: list[str]
) -> dict[str, object]:
    """Up to ``CHUNK`` bytes of one of the session's files from ``offset``: only of a file
    in the manifest last served for a node of ``peer_names`` (``sealed_manifest``: the copy
    sealed for it), and only within the size the manifest gave it."""
    directory = session_dir(home, session)
    with _SEALED_LOCK:
        granted = _GRANTED.get(directory)
    if granted is None or granted[0] not in peer_names:
        raise MoveFailed(session, "copy", f"its log is not sealed for {', '.join(peer_names)}"
                         " (or its manifest was not asked for first)")  # fmt: skip
    size = granted[1].get(name)
    if size is None or not 0 <= offset <= size:
        raise MoveFailed(session, "copy", f"no file {name!r} at offset {offset} to send")
    with open(os.path.join(directory, name), "rb") as f:
        f.seek(offset)
        data = f.read(min(CHUNK, size - offset))
    return {"data": data, "eof": offset + len(data) >= size}


def answer_files(home: str, message: Message, peer_names: list[str]) -> Message:
    """The reply to ``files`` (the manifest) or ``file`` (a chunk) from ``home``, for a
    session sealed for the peer node (the TLS gateway asks, in a thread of its own)."""
    request_id = message.get("id")
    session, name, offset = message.get("session"), message.get("name"), message.get("offset")
    try:
        if not isinstance(session, str):
            raise WireError("field 'session' must be a string")
        if message.get("op") == "files":
            return ok(request_id, {"files": sealed_manifest(home, session, peer_names)})
        if not isinstance(name, str) or type(offset) is not int:
            raise WireError("fields 'name' (a string) and 'offset' (an integer) are needed")
        return ok(request_id, read_chunk(home, session, name, offset, peer_names))
    except (WireError, ValueError) as exc:
        return error(request_id, "bad_request", str(exc))
    except (ClusterError, SessionError, OSError) as exc:
        return error(request_id, "move_failed", str(exc))


def pull_here(
    client: EtcdClient, node: str, home: str, session: str, tls: TlsFiles | None
) -> dict[str, object]:
    """The target's steps 3 and 4: pull, check and install the source's sealed copy."""
    intent = _intent(client, session, "copy")
    if intent.target != node:
        raise MoveFailed(session, "copy", f"the move in etcd is to {intent.target}, not {node}")
    address = node_address(client, intent.source)
    if address is None:
        raise MoveFailed(session, "copy", f"the source {intent.source} is not registered")
    if tls is None:
        raise MoveFailed(session, "copy", "this node has no TLS certificate to pull with")
    link = NodeLink(address, intent.source, tls, timeout=PULL_TIMEOUT)
    try:
        manifest = _manifest(link, session)
        installed = session_dir(home, session)
        if not os.path.isdir(installed):
            _pull_files(link, session, home, manifest)
        expected = {str(f["name"]): str(f["sha256"]) for f in manifest}
        copy = installed if os.path.isdir(installed) else incoming_dir(home, session)
        found = file_hashes(copy)
        if found != expected:
            differ = sorted(n for n in found.keys() | expected.keys()
                            if found.get(n) != expected.get(n))  # fmt: skip
            raise MoveFailed(session, "verify", f"the copy differs from the source in {differ}")
        if copy != installed:
            install_copy(home, session)
    except ControlError as exc:
        raise MoveFailed(session, "copy", f"from {intent.source}: {exc}") from exc
    finally:
        link.close()
    return {"session": session, "files": len(manifest), "from": intent.source}


def _manifest(link: NodeLink, session: str) -> list[dict[str, object]]:
    answer = link.call("files", session=session)
    files = answer.get("files") if isinstance(answer, dict) else None
    if not isinstance(files, list) or not all(
        isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(f.get("size"), int)
        and isinstance(f.get("sha256"), str) for f in files
    ):  # fmt: skip
        raise MoveFailed(session, "copy", f"a bad manifest from the source: {answer!r:.200}")
    return files


def _pull_files(link: NodeLink, session: str, home: str, manifest: list[dict[str, object]]) -> None:
    """Stream every file into ``incoming/<id>``: size and SHA-256 checked, each fdatasynced,
    the directory and its parent fsynced."""
    parent = os.path.join(home, INCOMING_DIR)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    target = incoming_dir(home, session)
    if os.path.exists(target):
        shutil.rmtree(target)  # a partial copy of an interrupted pull
    durable.mkdir(target)
    for entry in manifest:
        name, size, sha = str(entry["name"]), int(str(entry["size"])), str(entry["sha256"])
        if os.sep in name or name.startswith("."):
            raise MoveFailed(session, "copy", f"the source named a file {name!r}")
        path = os.path.join(target, name)
        digest = hashlib.sha256()
        written = 0
        fd = durable.create(path)
        try:
            while True:
                chunk = link.call("file", session=session, name=name, offset=written)
                data = chunk.get("data") if isinstance(chunk, dict) else None
                if (
                    not isinstance(chunk, dict)
                    or not isinstance(data, bytes)
                    or (written + len(data) > size)
                ):
                    raise MoveFailed(session, "copy", f"{name}: a bad chunk at byte {written}")
                durable.write_all(fd, data, path)
                digest.update(data)
                written += len(data)
                if chunk.get("eof") or not data:
                    break
            durable.fdatasync(fd, path)
        finally:
            durable.close(fd)
        if written != size or digest.hexdigest() != sha:
            raise MoveFailed(session, "verify", f"{name}: {written} bytes with SHA-256 "
                             f"{digest.hexdigest()}, the source has {size} with {sha}")  # fmt: skip
    durable.fsync_dir(target)
    durable.fsync_dir(parent)


def discard_here(client: EtcdClient, node: str, home: str, session: str) -> dict[str, object]:
    """An aborted move's target: remove its copy, never served, once etcd shows no move
    of the session and neither places it here nor names this node its owner."""
    owner = owner_of(client, session)
    if client.get(move_key(session)) is not None:
        raise MoveFailed(session, "abort", "a move of it is still in progress in etcd")
    if placement_of(client, session) == node or (owner is not None and owner.node == node):
        raise MoveFailed(session, "abort", f"it is placed on or owned by {node}: not discarded")
    removed = 0
    _forget_seal(session_dir(home, session))
    for leftover in (incoming_dir(home, session), session_dir(home, session)):
        if os.path.isdir(leftover):
            shutil.rmtree(leftover)
            durable.fsync_dir(os.path.dirname(leftover))
            removed += 1
    return {"session": session, "discarded": removed}


def release_here(client: EtcdClient, node: str, home: str, session: str) -> dict[str, object]:
    """The source's step 7: remove its copy, once etcd says the target owns the session."""
    intent = _intent(client, session, "release")
    owner = owner_of(client, session)
    if intent.source != node or owner is None or owner.node != intent.target:
        raise MoveFailed(session, "release", f"{intent.target} does not own it yet")
    if placement_of(client, session) != intent.target:
        raise MoveFailed(session, "release", f"it is not placed on {intent.target} yet")
    remove_released(home, session, f"moved-{owner.token}")
    _forget_seal(session_dir(home, session))
    return {"session": session, "released": True}
