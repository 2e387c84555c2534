"""Helpers for the cluster tests: nodes registered in a real etcd, sessions, keyed writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.lease import LeaseTiming, NodeLease
from supervisor.cluster.ownership import owner_of, place_new
from worker import LogSealed, Owner, Session, SessionError
from worker.app import DefaultApp
from worker.store.disk.layout import session_dir
from worker.store.loader import load_session

TTL: Final = 2
"""The lease TTL of node processes in tests: short, so that a lost node's lease ends soon."""
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

    def held(self, session: str) -> tuple[int, int] | None:
        """What a ClusterNode serves ``session`` with: nothing (no daemon hosts it)."""
        return None


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


def writers(client: EtcdClient, homes: dict[str, Path], session: str) -> list[str]:
    """The nodes able to write the session now: etcd names them owner, and their copy agrees.

    A copy agrees when it is not sealed, or is sealed for this node with a token lower
    than the one etcd gave it (the node appends its Owner, then writes).
    """
    owner = owner_of(client, session)
    able = []
    for name, home in homes.items():
        if owner is None or owner.node != name:
            continue
        try:  # read without the lock: a node's worker may hold it
            fence = load_session(session_dir(home, session), session).fence
        except SessionError:
            continue
        if fence.token > owner.token:
            continue
        if fence.sealed is None or (fence.sealed.to == name and fence.sealed.token < owner.token):
            able.append(name)
    return able


class NodeProcess:
    """A real node process (tests/programs/cluster_node_process.py) taking keyed writes on stdin."""

    def __init__(self, url: str, name: str, home: Path) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.programs.cluster_node_process",
                url,
                name,
                str(home),
                str(TTL),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.claims = self._line()

    def _line(self) -> dict[str, object]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, "the node process ended"
        reply = json.loads(line)
        assert isinstance(reply, dict)
        return reply

    def send(self, key: str) -> dict[str, object]:
        assert self.process.stdin is not None
        self.process.stdin.write(f"send {key}\n")
        self.process.stdin.flush()
        return self._line()

    def claim(self) -> dict[str, object]:
        assert self.process.stdin is not None
        self.process.stdin.write("claim\n")
        self.process.stdin.flush()
        return self._line()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
