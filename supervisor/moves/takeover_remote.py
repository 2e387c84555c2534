"""``loopd takeover ID --from-copy PATH --to NODE`` when NODE is on another host.

The copy is on the operator's host, the target's home is not: the operator checks the
copy (it must open: not torn, not invalid), pushes each file to the target over the
transport (``receive``: chunks written into ``<home>/incoming/<id>/``), has the target
check every file's size and SHA-256 against the operator's manifest, fsync and install
it (``install``), then makes the same transaction as a local takeover and asks the
target to ``adopt`` it (it writes ``Owner{to, T'}`` and serves). Lossy in the same way
(docs/scaling.md section 7).
"""

from __future__ import annotations

import hashlib
import os
from typing import Final, Protocol

from supervisor.cluster.errors import MoveFailed
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.etcd_types import Put, absent
from supervisor.cluster.keys import move_key, node_value, owner_key, placement_key
from supervisor.cluster.ownership import owner_of
from supervisor.moves.move import MoveDone, node_home
from supervisor.moves.session_files import session_files
from worker import SessionError
from worker.store.loader import load_session

CHUNK: Final = 512 << 10


class NodeRequests(Protocol):
    """One control request with fields to a node (over TLS)."""

    def request(self, node: str, op: str, **fields: object) -> object: ...


def take_over_remote(
    client: EtcdClient, session: str, copy: str, target: str, nodes: NodeRequests
) -> MoveDone:
    """Push ``copy`` to ``target``, install it there and make the target the owner; lossy."""
    owner = owner_of(client, session)
    if owner is not None:
        raise MoveFailed(
            session, "takeover", f"{owner.node} owns it (token {owner.token}) and its lease "
            "is alive: use `loopd move`, or wait for it to expire",
        )  # fmt: skip
    try:
        load_session(copy, session)  # refuse a torn or invalid copy before sending it
    except SessionError as exc:
        raise MoveFailed(session, "takeover", f"the copy is refused: {exc}") from exc
    manifest = []
    first = True
    for name in session_files(copy):
        digest = hashlib.sha256()
        offset = 0
        with open(os.path.join(copy, name), "rb") as f:
            while True:
                data = f.read(CHUNK)
                nodes.request(target, "receive", session=session, name=name, offset=offset,
                              data=data, first=first or None)  # fmt: skip
                first = False
                digest.update(data)
                offset += len(data)
                if len(data) < CHUNK:
                    break
        manifest.append({"name": name, "size": offset, "sha256": digest.hexdigest()})
    nodes.request(target, "install", session=session, files=manifest)
    _home, lease = node_home(client, target)
    result = client.txn(
        [absent(owner_key(session)), absent(move_key(session))],
        [
            Put(key=owner_key(session), value=node_value(target), lease=lease),
            Put(key=placement_key(session), value=node_value(target)),
        ],
    )
    if not result.succeeded:
        nodes.request(target, "discard", session=session)
        raise MoveFailed(session, "takeover", "another owner or a move appeared meanwhile")
    nodes.request(target, "adopt", session=session)
    return MoveDone(session=session, node=target, token=result.revision)
