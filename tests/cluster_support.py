"""Helpers for the cluster tests: nodes registered in a real etcd, sessions, keyed writes."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.lease import LeaseTiming, NodeLease
from supervisor.cluster.ownership import owner_of, place_new
from worker import LogSealed, Owner, Session, SessionError
from worker.app import DefaultApp
from worker.layout import session_dir

APP = DefaultApp(budget=40)
"""A small context budget: a few requests close an epoch, so moves cross epoch changes."""


@dataclass
class Node:
    """A node of the test cluster: its name, home and registered lease."""

    name: str
    home: Path
    lease: NodeLease

    @property
    def lease_id(self) -> int:
        return self.lease.lease_id


def register(client: EtcdClient, name: str, home: Path, ttl: int = 10) -> Node:
    """Register a node under a lease of ``ttl`` seconds (no keepalive thread)."""
    home.mkdir(parents=True, exist_ok=True)
    lease = NodeLease(
        client,
        name,
        {"address": f"unix:{home}/loopd.sock", "home": str(home)},
        timing=LeaseTiming(ttl=ttl),
    )
    lease.register()
    return Node(name, home, lease)


def create_session(client: EtcdClient, node: Node, session: str, slot: int = 7) -> int:
    """Create a session on ``node``, place and own it in etcd, write its Owner; the token.

    Slot 7 is the chaos rig's, so that its oracle checks these sessions as its own.
    """
    token = place_new(client, session, node.name, node.lease_id)
    with Session.create(node.home, session, APP.initial_baseline(session), slot=slot) as opened:
        opened.append(Owner(node=node.name, token=token))
    return token


def send(home: Path, session: str, key: str) -> dict[str, object]:
    """Apply one keyed request of the default app to the session in ``home``."""
    with Session.open(home, session) as opened:
        return APP.handle(opened, {"text": f"text of {key}", "key": key})


def try_send(home: Path, session: str, key: str) -> bool:
    """Apply a keyed request if the copy in ``home`` takes writes; True if acknowledged."""
    if not os.path.isdir(session_dir(home, session)):
        return False
    try:
        send(home, session, key)
    except LogSealed:
        return False
    return True


def writers(client: EtcdClient, nodes: list[Node], session: str) -> list[str]:
    """The nodes able to write the session now: etcd names them owner, and their copy agrees.

    A copy agrees when it is not sealed, or is sealed for this node with a token lower
    than the one etcd gave it (the node appends its Owner, then writes).
    """
    owner = owner_of(client, session)
    able = []
    for node in nodes:
        if owner is None or owner.node != node.name:
            continue
        try:
            with Session.open(node.home, session) as opened:
                fence = opened.fence
        except SessionError:
            continue
        if fence.token > owner.token:
            continue
        if fence.sealed is None or (
            fence.sealed.to == node.name and fence.sealed.token < owner.token
        ):
            able.append(node.name)
    return able
