"""The TLS transport on loopback: a node's ``--listen tls://`` port, and who it refuses.

Each test has an etcd and one node (``a``, serving TLS) of its own. The refusals of
docs/scaling.md ("The transport") are each checked on both ends: the client's error is
one line, the node's log has one ``tls: refused`` line for it, nothing was served (no
session placed, no reply), and the node goes on serving a client whose certificate is
good.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from supervisor.client.cluster import ClusterClient
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.lease import LeaseTiming, NodeLease
from supervisor.cluster.ownership import placement_of
from supervisor.cluster.peer_link import NodeLink
from supervisor.cluster.routing import node_address
from supervisor.cluster.transport import Role, TlsFiles
from supervisor.errors import ControlError
from tests.harness.etcd_server import EtcdServer, free_port
from tests.harness.support import Daemon, loopd, poll_until
from tests.harness.tls_certs import Certificates
from worker.ipc.wire import encode

pytestmark = pytest.mark.timeout(90)


@dataclass
class TlsCluster:
    etcd: EtcdServer
    certs: Certificates
    node: Daemon
    address: str
    client: TlsFiles

    def refusals(self) -> list[str]:
        text = self.node.log_path.read_text(errors="replace")
        return [line for line in text.splitlines() if "tls: refused" in line]

    def still_serves(self, session: str) -> None:
        """A good client creates ``session`` and is answered (the node serves on)."""
        with ClusterClient(self.etcd.url, timeout=20, tls=self.client) as cluster:
            cluster.create(session)
            assert cluster.send(session, "hello", key="k")["text"] == "echo: hello"


@pytest.fixture
def tls_cluster(tmp_path: Path) -> Iterator[TlsCluster]:
    root = tmp_path / "tls"
    certs = Certificates(root / "certs")
    etcd = EtcdServer(root / "etcd")
    etcd.start()
    try:
        address = f"tls://127.0.0.1:{free_port()}"
        node_files = certs.issue("a", Role.NODE)
        args = ["--cluster", etcd.url, "--node", "a", "--listen", address]
        node = Daemon(root / "a", *args, *certs.args(node_files))
        try:
            yield TlsCluster(etcd, certs, node, address, certs.issue("app", Role.CLIENT))
        finally:
            node.stop()
    finally:
        etcd.stop()


def refused_once(cluster: TlsCluster, before: int, *words: str) -> str:
    """The one new refusal line of the node's log, checked to name ``words``."""
    lines = poll_until(lambda: cluster.refusals()[before:] or None, what="the node's refusal line")
    assert len(lines) == 1, lines
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def one_line(exc: ControlError) -> str:
    text = str(exc)
    assert "\n" not in text
    assert "Traceback" not in text
    return text


def test_the_node_registers_its_tls_address_and_serves_a_client_over_it(
    tls_cluster: TlsCluster,
) -> None:
    with EtcdClient(tls_cluster.etcd.url) as etcd:
        assert node_address(etcd, "a") == tls_cluster.address
    with ClusterClient(tls_cluster.etcd.url, timeout=20, tls=tls_cluster.client) as cluster:
        cluster.create("plain1")
        first = cluster.send("plain1", "hello", key="k1")
        again = cluster.send("plain1", "hello", key="k1")
        assert (first["duplicate"], again["duplicate"]) == (False, True)
        assert isinstance(first["token"], int)
        assert first["token"] == again["token"]
        rows = [row for row in cluster.status() if isinstance(row, dict)]
        assert {"session": "plain1", "node": "a"}.items() <= next(
            row for row in rows if row["session"] == "plain1"
        ).items()


@pytest.mark.parametrize("kind", ["other_ca", "expired", "no_role"])
def test_a_client_certificate_the_node_cannot_verify_or_place_is_refused(
    tls_cluster: TlsCluster, kind: str
) -> None:
    certs = tls_cluster.certs
    if kind == "other_ca":
        files = certs.issue("intruder", Role.CLIENT, ca=trustme.CA())
    elif kind == "expired":
        files = certs.issue("late", Role.CLIENT, expired=True)
    else:  # of the cluster CA, valid, but with no loopd role (OU)
        files = certs.issue("nobody", None)
    before = len(tls_cluster.refusals())
    session = f"bad-{kind}"
    with (
        ClusterClient(tls_cluster.etcd.url, timeout=10, tls=files) as cluster,
        pytest.raises(ControlError) as caught,
    ):
        cluster.create(session)
    assert caught.value.code in ("tls_refused", "closed")
    assert "node a" in one_line(caught.value)
    wanted = {
        "other_ca": ["certificate refused", "unable to get local issuer"],
        "expired": ["certificate refused", "expired"],
        "no_role": ["without a loopd role", "CN=nobody"],
    }[kind]
    refused_once(tls_cluster, before, *wanted)
    with EtcdClient(tls_cluster.etcd.url) as etcd:
        assert placement_of(etcd, session) is None  # nothing was served
    tls_cluster.still_serves(f"after-{kind}")


def test_a_plaintext_client_on_the_tls_port_is_refused_and_answered_nothing(
    tls_cluster: TlsCluster,
) -> None:
    before = len(tls_cluster.refusals())
    host, port = tls_cluster.address.removeprefix("tls://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(encode({"id": 1, "op": "create", "session": "plaintext"}))
        received = b""
        try:
            while chunk := raw.recv(4096):
                received += chunk
        except ConnectionResetError:
            pass
    assert b"plaintext" not in received
    assert not received.startswith(b"\x00")  # no frame of ours: at most a TLS alert
    refused_once(tls_cluster, before, "127.0.0.1")
    with EtcdClient(tls_cluster.etcd.url) as etcd:
        assert placement_of(etcd, "plaintext") is None
    tls_cluster.still_serves("after-plaintext")


def test_a_node_whose_certificate_names_another_node_is_refused_by_the_client(
    tls_cluster: TlsCluster,
) -> None:
    """etcd names node ``b`` at node a's address: the client reaches a certificate for a."""
    with EtcdClient(tls_cluster.etcd.url) as etcd:
        impostor = NodeLease(etcd, "b", {"address": tls_cluster.address},
                             timing=LeaseTiming(ttl=30))  # fmt: skip
        impostor.register()
        try:
            with (
                ClusterClient(tls_cluster.etcd.url, timeout=10, tls=tls_cluster.client) as c,
                pytest.raises(ControlError) as caught,
            ):
                c.status()
        finally:
            impostor.close()
    assert caught.value.code == "tls_refused"
    assert "node b" in one_line(caught.value)
    assert "Hostname mismatch" in str(caught.value) or "hostname" in str(caught.value).lower()
    tls_cluster.still_serves("after-impostor")


def test_a_node_will_not_serve_with_a_certificate_for_another_name(
    tls_cluster: TlsCluster, tmp_path: Path
) -> None:
    files = tls_cluster.certs.issue("c", Role.NODE)
    result = loopd(
        "serve", "--home", str(tmp_path / "d"), "--cluster", tls_cluster.etcd.url,
        "--node", "d", "--listen", f"tls://127.0.0.1:{free_port()}",
        *tls_cluster.certs.args(files),
    )  # fmt: skip
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "does not name node d" in lines[0]


def test_a_client_certificate_presented_as_a_node_is_refused_both_ways(
    tls_cluster: TlsCluster, tmp_path: Path
) -> None:
    # A peer with a client certificate asking what only nodes ask: refused, one line.
    before = len(tls_cluster.refusals())
    link = NodeLink(tls_cluster.address, "a", tls_cluster.client, timeout=10)
    try:
        with pytest.raises(ControlError) as caught:
            link.call("adopt", session="stolen")
        assert caught.value.code == "forbidden"
        one_line(caught.value)
        refused_once(tls_cluster, before, "'adopt'", "loopd-client")
        assert isinstance(link.call("ping"), dict)  # the same connection serves what it may
    finally:
        link.close()
    # A server holding a client certificate, reached as node "a": the client refuses it.
    posing = tls_cluster.certs.issue("a", Role.CLIENT)
    context = posing.server_context()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def answer_once() -> None:
            conn, _ = listener.accept()
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (OSError, ssl.SSLError):
                pass

        thread = threading.Thread(target=answer_once)
        thread.start()
        fake = NodeLink(f"tls://127.0.0.1:{port}", "a", tls_cluster.client, timeout=10)
        try:
            with pytest.raises(ControlError) as caught:
                fake.call("ping")
        finally:
            fake.close()
            thread.join(timeout=10)
    assert caught.value.code == "tls_refused"
    assert "not a node certificate" in one_line(caught.value)
    # And a node will not serve with one.
    result = loopd(
        "serve", "--home", str(tmp_path / "e"), "--cluster", tls_cluster.etcd.url,
        "--node", "a", "--listen", f"tls://127.0.0.1:{free_port()}",
        *tls_cluster.certs.args(posing),
    )  # fmt: skip
    assert result.returncode == 1
    assert "is not a node certificate" in result.stderr.strip()
    assert len(result.stderr.strip().splitlines()) == 1
    tls_cluster.still_serves("after-posing")


def test_handshakes_that_never_finish_are_capped_and_the_node_serves_on(
    tls_cluster: TlsCluster,
) -> None:
    """No certificate is needed to start a handshake: a peer that opens many and finishes
    none has the oldest closed for each one past the cap, and the node serves on."""
    from supervisor.gateway.tls_gateway import MAX_HANDSHAKES

    host, port = tls_cluster.address.removeprefix("tls://").split(":")
    half_open = []
    try:
        for _ in range(MAX_HANDSHAKES + 1):
            raw = socket.create_connection((host, int(port)), timeout=10)
            raw.sendall(b"\x16\x03\x01")  # the start of a ClientHello, never the rest
            half_open.append(raw)
        # The one past the cap closes the oldest (an empty read); the node's line says it
        # was closed for a newer handshake, not by the 10 s handshake timeout (a loaded
        # machine may take a while to get there: the line, not the time, is the check).
        half_open[0].settimeout(60.0)
        with contextlib.suppress(ConnectionResetError):
            assert half_open[0].recv(1) == b""
        poll_until(
            lambda: any("closed for a newer handshake" in x for x in tls_cluster.refusals()),
            what="the node's line for the oldest connection closed",
        )
    finally:
        for raw in half_open:
            raw.close()
    tls_cluster.still_serves("after-half-open")
