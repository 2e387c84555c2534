"""The direct data path over TCP against hostile peers and a flooded port.

A node that resets the connection right after the preamble must cost the client one
``ControlError`` line and no leaked socket; connections that open and say nothing must
not keep a client out of the node's TLS port (docs/scaling.md, "How the port is served").
"""

from __future__ import annotations

import contextlib
import gc
import socket
import ssl
import struct
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from supervisor.client.tcp_direct import DirectLink
from supervisor.cluster.peer_link import NodeLink
from supervisor.cluster.transport import Role, TlsFiles, direct_preamble
from supervisor.errors import ControlError
from tests.harness.support import log_user_keys, poll_until
from tests.harness.tls_certs import Certificates
from tests.harness.tls_node import Node, start_node
from worker import Baseline, Handoff, Owner, Session, User
from worker.ipc.tls_roles import load_context
from worker.ipc.wire import FrameReader, Message, encode

pytestmark = pytest.mark.timeout(90)

BASELINE = Baseline(system="s", memory="", tools=[])
T = "2026-11-29T20:17:57.123456Z"


class _AfterTheReset(ssl.SSLContext):
    """A client context whose handshake starts only once the node's reset has arrived:
    the order a loaded machine gives when the node refuses right after the preamble."""

    def wrap_socket(self, sock: socket.socket, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        def reset() -> bool:
            try:
                sock.getpeername()
            except OSError:
                return True
            return False

        poll_until(reset, timeout=10, what="the node's reset")
        return super().wrap_socket(sock, *args, **kwargs)  # type: ignore[arg-type]


def _resetting_node(preamble: bytes = b"") -> tuple[socket.socket, int]:
    """A listener that ends its side at once, reads ``preamble``, then resets."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.shutdown(socket.SHUT_WR)
            if preamble:
                conn.recv(len(preamble))
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    threading.Thread(target=serve, daemon=True).start()
    return listener, listener.getsockname()[1]


def _late_context(files: TlsFiles) -> ssl.SSLContext:
    context = load_context(_AfterTheReset(ssl.PROTOCOL_TLS_CLIENT), files.ca, files.cert, files.key)
    context.check_hostname = True
    return context


def test_a_node_that_resets_after_the_preamble_is_one_line_and_no_leak(tmp_path: Path) -> None:
    files = Certificates(tmp_path / "certs").issue("app", Role.CLIENT)
    listener, port = _resetting_node(direct_preamble("s"))
    link = DirectLink(f"tls://127.0.0.1:{port}", "a", "s", files, timeout=10,
                      context=_late_context(files))  # fmt: skip
    gc.collect()  # what earlier tests left to the collector is theirs, not this link's
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            with pytest.raises(ControlError) as refused:
                link.request({"text": "x", "key": "k"})
            gc.collect()
    finally:
        link.close()
        listener.close()
    assert refused.value.code == "closed", refused.value
    assert "node a at tls://127.0.0.1" in str(refused.value)
    assert "\n" not in str(refused.value)
    leaked = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaked == []


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    yield from start_node(tmp_path)


def test_idle_connections_at_the_cap_do_not_keep_a_client_out(node: Node) -> None:
    """No certificate is needed to open a connection: as many as the TLS thread takes at
    once, saying nothing, must not refuse a client (one try, no retry) while they stay."""
    from supervisor.gateway.tls_gateway import MAX_HANDSHAKES

    host, port = node.address.removeprefix("tls://").split(":")
    with node.cluster() as cluster:
        cluster.create("s")
    idle: list[socket.socket] = []
    try:
        for n in range(MAX_HANDSHAKES):
            idle.append(socket.create_connection((host, int(port)), timeout=10))
            if n % 2:
                idle[-1].sendall(direct_preamble("nosuch")[:-1])  # a preamble never ended
        # Accepted in the order they came: the client's connection finds the cap reached.
        link = DirectLink(node.address, "a", "s", node.client, timeout=10)
        try:
            reply = link.request({"text": "in", "key": "k1"})
        finally:
            link.close()
        assert reply.get("ok") is True, reply
        idle[0].settimeout(10)
        with contextlib.suppress(ConnectionResetError):
            assert idle[0].recv(1) == b""  # the oldest, closed to make room
    finally:
        for raw in idle:
            raw.close()
    assert log_user_keys(node.home, "s") == ["k1"]
    assert "closed for a newer handshake" in node.daemon.log_path.read_text()


def test_a_peer_that_never_reads_its_replies_does_not_grow_the_node(node: Node) -> None:
    """The TLS thread answers a node's ``file`` op itself (a chunk of a session's file, for
    a move's pull, of a copy sealed for the node asking). A node certificate asking for
    a 20 KB file 1,500 times (30 MB of replies) without reading must stop being read,
    not buffer every reply."""
    with Session.create(node.home, "big", BASELINE) as big:
        big.append(Owner(node="a", token=5))
        for n in range(100):
            big.append(User(time=T, text="x" * 200, key=f"k{n}"))
        big.append(Handoff(to="b", token=5))  # sealed for b: its files may be pulled
    size = (node.home / "sessions" / "big" / "0.jsonl").stat().st_size
    assert size > 20_000, size
    files = node.certs.issue("b", Role.NODE)
    manifest = encode({"id": 0, "op": "files", "session": "big"})
    ask = encode({"id": 1, "op": "file", "session": "big", "name": "0.jsonl", "offset": 0})
    daemon = psutil.Process(node.daemon.proc.pid)
    before = daemon.memory_info().rss
    host, port = node.address.removeprefix("tls://").split(":")
    raw = socket.create_connection((host, int(port)), timeout=20)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)  # little held by the kernel
    with files.client_context().wrap_socket(raw, server_hostname="a") as peer:
        peer.sendall(manifest + ask * 1500)  # a few hundred KB: the kernel takes it all

        def grown() -> bool:
            return daemon.memory_info().rss - before > 12 << 20

        with pytest.raises(AssertionError, match="timed out"):
            poll_until(grown, timeout=6, what="the node growing by 12 MB")
        reader, replies = FrameReader(), list[Message]()
        while len(replies) < 11:  # and the replies come, once the peer reads
            replies += reader.feed(peer.recv(1 << 16))
    assert replies[0]["ok"] is True, replies[0]  # the manifest
    results = [reply["result"] for reply in replies[1:]]
    assert all(isinstance(r, dict) and len(r["data"]) == size for r in results), replies[0]


def test_a_forbidden_op_of_any_length_is_one_short_line(node: Node) -> None:
    link = NodeLink(node.address, "a", node.client, timeout=10)
    try:
        with pytest.raises(ControlError) as caught:
            link.call("x" * 100_000)
    finally:
        link.close()
    assert caught.value.code == "forbidden"
    assert len(str(caught.value)) < 300, len(str(caught.value))
    lines = poll_until(
        lambda: [x for x in node.daemon.log_path.read_text().splitlines() if "op 'xxx" in x],
        what="the node's line for the forbidden op",
    )
    assert len(lines) == 1
    assert len(lines[0]) < 400, len(lines[0])


def test_a_bad_frame_on_the_relayed_path_is_answered_before_the_end(node: Node) -> None:
    host, port = node.address.removeprefix("tls://").split(":")
    raw = socket.create_connection((host, int(port)), timeout=10)
    with node.client.client_context().wrap_socket(raw, server_hostname="a") as peer:
        peer.sendall(b"\xc1")  # a byte msgpack never uses
        received = b""
        with contextlib.suppress(ConnectionResetError, ssl.SSLError):
            while chunk := peer.recv(1 << 16):
                received += chunk
    replies = FrameReader().feed(received)
    assert len(replies) == 1, received
    failure = replies[0]["error"]
    assert isinstance(failure, dict)
    assert failure["code"] == "bad_frame"
    assert "undecodable frame" in str(failure["message"])
    assert "\n" not in str(failure["message"])
