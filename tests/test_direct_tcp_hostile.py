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

import pytest

from supervisor.client.tcp_direct import DirectLink
from supervisor.cluster.transport import Role, direct_preamble
from supervisor.errors import ControlError
from tests.support import log_user_keys, poll_until
from tests.test_cluster_direct_tcp import Node, start_node
from tests.tls_certs import Certificates
from worker.tls_roles import load_context

pytestmark = pytest.mark.timeout(90)


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


def test_a_node_that_resets_after_the_preamble_is_one_line_and_no_leak(tmp_path: Path) -> None:
    certs = Certificates(tmp_path / "certs")
    files = certs.issue("app", Role.CLIENT)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def node() -> None:  # ends its side at once, reads the preamble, then resets
        conn, _ = listener.accept()
        with conn:
            conn.shutdown(socket.SHUT_WR)
            conn.recv(len(direct_preamble("s")))
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    serving = threading.Thread(target=node, daemon=True)
    serving.start()
    context = load_context(_AfterTheReset(ssl.PROTOCOL_TLS_CLIENT), files.ca, files.cert, files.key)
    context.check_hostname = True
    link = DirectLink(f"tls://127.0.0.1:{port}", "a", "s", files, timeout=10, context=context)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            with pytest.raises(ControlError) as refused:
                link.request({"text": "x", "key": "k"})
            gc.collect()
    finally:
        link.close()
        serving.join(10)
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
    from supervisor.daemon.tls_gateway import MAX_HANDSHAKES

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
