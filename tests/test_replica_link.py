"""The replication channel of a node's TLS port: an owner's link served by a thread of its own.

A gateway in this process (real sockets, real threads, certificates of a test CA): a
connection opening with ``REPLICA_PREAMBLE`` is handed to a thread of ``replica_link``,
which serves only a node certificate's replication ops; a peer that never ends its
handshake is dropped at the deadline and holds no thread after it; past the cap a link is
served by the gateway's loop instead, and no more threads are started.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from supervisor.cluster.transport import REPLICA_PREAMBLE, Role, TlsFiles
from supervisor.daemon.tls_gateway import TlsGateway
from tests.etcd_server import free_port
from tests.support import poll_until
from tests.test_replica_receiver_hostile import _steps
from tests.tls_certs import Certificates
from worker.store.replica_types import Step
from worker.wire import FrameReader, Message, encode

pytestmark = pytest.mark.timeout(60)
THREAD = "loopd-replica-link"


@dataclass
class Node:
    gateway: TlsGateway
    certs: Certificates
    home: Path
    lines: list[str]

    def link_threads(self) -> int:
        return sum(t.name == THREAD and t.is_alive() for t in threading.enumerate())


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    certs = Certificates(tmp_path / "certs")
    home = tmp_path / "a"
    home.mkdir()
    lines: list[str] = []
    address = f"tls://127.0.0.1:{free_port()}"
    # The loop's path relays what it does not answer itself to the node's control socket:
    # one that listens (the kernel queues the relay's connection) is all it needs here.
    control = socket.socket(socket.AF_UNIX)
    control.bind(str(home / "x.sock"))
    control.listen()
    gateway = TlsGateway(address, certs.issue("a", Role.NODE), str(home / "x.sock"), lines.append)
    gateway.open()
    try:
        yield Node(gateway, certs, home, lines)
    finally:
        gateway.close()
        control.close()
    assert sum(t.name == THREAD for t in threading.enumerate()) == 0


def _raw(node: Node, preamble: bytes = REPLICA_PREAMBLE) -> socket.socket:
    raw = socket.create_connection(("127.0.0.1", node.gateway.port), timeout=10)
    raw.sendall(preamble)
    return raw


def _link(node: Node, files: TlsFiles) -> ssl.SSLSocket:
    return files.client_context().wrap_socket(_raw(node), server_hostname="a")


def _call(link: ssl.SSLSocket, request: Message) -> Message:
    link.sendall(encode(request))
    reader = FrameReader()
    while True:
        data = link.recv(1 << 16)
        assert data, "the link closed without a reply"
        replies = reader.feed(data)
        if replies:
            return replies[0]


def _replicate(step: Step) -> Message:
    return {"id": 1, "op": "replicate", "step": step.to_message()}


@pytest.mark.parametrize("role", [Role.CLIENT, Role.OPERATOR])
def test_a_client_or_operator_certificate_is_forbidden_on_the_channel_and_writes_nothing(
    node: Node, tmp_path: Path, role: Role
) -> None:
    steps = _steps(tmp_path / "owner")
    copy = node.home / "replicas" / "sessions" / "s"
    with _link(node, node.certs.issue("b", role)) as link:
        for request in (_replicate(steps[0]), {"id": 2, "op": "replica_position", "session": "s"}):
            reply = _call(link, request)
            assert reply["ok"] is False, reply
            failure = reply["error"]
            assert isinstance(failure, dict)
            assert failure["code"] == "forbidden", reply
            assert f"a {role.value} certificate may not ask" in str(failure["message"])
    assert not copy.exists()
    assert node.gateway.links.served == 1  # answered by the link's thread, not the loop
    assert any("tls: refused" in x and role.value in x for x in node.lines), node.lines
    # The same step from a node certificate is written: it was refused for the role alone.
    with _link(node, node.certs.issue("b", Role.NODE)) as link:
        assert _call(link, _replicate(steps[0]))["ok"] is True
        refused = _call(link, {"id": 3, "op": "files", "session": "s"})  # not on this channel
        assert refused["ok"] is False, refused
        assert refused["error"]["code"] == "forbidden", refused  # type: ignore[index]
    assert copy.is_dir()


def test_a_link_that_never_ends_its_handshake_is_dropped_at_the_deadline(node: Node) -> None:
    node.gateway.links.handshake_timeout = 1.5
    # The preamble, then the start of a TLS record that never goes on.
    stalled = _raw(node, REPLICA_PREAMBLE + b"\x16\x03\x01\x00")
    opened = time.monotonic()
    try:
        poll_until(lambda: node.link_threads() == 1, timeout=10, what="the link's thread")
        # Meanwhile an owner's link is served by a thread of its own.
        with _link(node, node.certs.issue("b", Role.NODE)) as link:
            reply = _call(link, {"id": 1, "op": "replica_position", "session": "s"})
            assert reply["ok"] is True, reply
        assert stalled.recv(1) == b""  # blocks until the node drops it (timeout 10 s)
        waited = time.monotonic() - opened
    finally:
        stalled.close()
    assert waited >= 1.0, waited  # not dropped before its deadline
    poll_until(lambda: node.gateway.links.running == 0, timeout=10, what="no link running")
    poll_until(lambda: node.link_threads() == 0, timeout=10, what="its thread ended")
    assert any("replication link" in x and "no TLS handshake in time" in x for x in node.lines)


def test_links_past_the_cap_start_no_thread_and_are_served_by_the_loop(node: Node) -> None:
    node.gateway.links.limit = 2
    stalled = [_raw(node) for _ in range(2)]
    try:
        poll_until(lambda: node.gateway.links.running == 2, timeout=10, what="two links")
        with _link(node, node.certs.issue("b", Role.NODE)) as link:
            reply = _call(link, {"id": 1, "op": "replica_position", "session": "s"})
            assert reply["ok"] is True, reply
            assert node.gateway.links.running == 2
            assert node.link_threads() == 2
        assert node.gateway.links.served == 2
        assert any("(the limit): this one by the loop" in x for x in node.lines), node.lines
        # Closing them ends the links still in their handshake at once, not at the deadline.
        started = time.monotonic()
        node.gateway.links.close()
        assert time.monotonic() - started < 5.0
        assert node.gateway.links.running == 0
        assert node.link_threads() == 0
    finally:
        for raw in stalled:
            raw.close()
