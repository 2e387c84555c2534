"""The direct data path over TCP: a preamble, the socket handed to the worker, TLS there.

Each test has an etcd and one node (``a``, serving ``--listen tls://`` on loopback) of
its own. ``ClusterClient.send`` opens its connection with the preamble naming the
session; the node's TLS thread makes a first TLS handshake and checks the client's
tenant, then hands the raw socket to the session's worker, which makes the second
(docs/scaling.md, "How the port is served"). The worker's
``status`` (asked on a local direct connection) counts its TLS peers and handshakes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from supervisor.client import Client
from supervisor.client.tcp_direct import DirectLink
from supervisor.cluster.peer_link import NodeLink
from supervisor.cluster.transport import Role
from supervisor.errors import ControlError
from tests.harness.support import log_user_keys, poll_until, status, stop
from tests.harness.tls_node import Node, start_node
from worker.ipc.wire import FrameReader, Message, encode

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    yield from start_node(tmp_path)


@pytest.fixture
def blocking_node(tmp_path: Path) -> Iterator[Node]:
    yield from start_node(tmp_path, "--app", "tests.apps:BlockingApp")


@pytest.fixture
def hibernating_node(tmp_path: Path) -> Iterator[Node]:
    yield from start_node(tmp_path, "--idle-stop", "3")


def worker_peers(home: Path, session: str) -> dict[str, int]:
    """The worker's own count of its connections, asked on a local direct connection."""
    with Client(str(home), timeout=10) as client:
        sock = client.link(session, time.monotonic() + 10)
        sock.sendall(encode({"id": 1, "op": "status"}))
        reader = FrameReader()
        while not (replies := reader.feed(sock.recv(1 << 16))):
            pass
    result = replies[0]["result"]
    assert isinstance(result, dict), replies
    peers = result.get("peers")
    assert isinstance(peers, dict), result  # a worker that does not count them: old code
    return peers


def one_line(exc: ControlError) -> str:
    text = str(exc)
    assert "\n" not in text
    assert "Traceback" not in text
    return text


def test_a_send_over_tcp_is_served_by_the_worker_while_the_daemon_is_stopped(node: Node) -> None:
    """SIGSTOP stops the daemon's loop and its TLS thread: a relayed send cannot be answered,
    a request on the worker's own TCP connection is."""
    with node.cluster(timeout=5) as cluster:
        cluster.create("s")
        first = cluster.send("s", "one", key="k1")
        state = first["state"]
        assert isinstance(state, dict)
        assert worker_peers(node.home, "s")["tls"] == 1
        stop(node.daemon.proc)
        try:
            second = cluster.send("s", "two", key="k2")
        finally:
            os.kill(node.daemon.proc.pid, signal.SIGCONT)
    assert second["text"] == "echo: two"
    assert second["duplicate"] is False
    assert second["token"] == first["token"]
    assert isinstance(second["state"], dict)
    assert second["state"]["pid"] == state["pid"]
    assert log_user_keys(node.home, "s") == ["k1", "k2"]


@pytest.mark.timeout(120)
def test_a_worker_killed_mid_request_is_sent_the_request_again_and_answers_from_its_log(
    blocking_node: Node,
) -> None:
    """BlockingApp applies ``block-after...`` durably, then hangs: the worker is SIGKILLed
    with the reply unsent. The client sees its connection end, makes a new one (to the
    restarted worker) and sends the same key: answered as a duplicate, applied once."""
    node = blocking_node
    outcome: dict[str, object] = {}
    with node.cluster(timeout=30) as cluster:
        cluster.create("s")
        before = cluster.send("s", "warm", key="k0")
        assert worker_peers(node.home, "s")["tls"] == 1  # the request goes to it over TCP

        def send() -> None:
            try:
                outcome["reply"] = cluster.send("s", "block-after-x", key="kb")
            except ControlError as exc:
                outcome["error"] = exc

        sender = threading.Thread(target=send)
        sender.start()
        try:
            marker = poll_until(
                lambda: next(node.home.glob("blocked-*"), None), what="the request in flight"
            )
            pid = int(marker.name.removeprefix("blocked-"))
            os.kill(pid, signal.SIGKILL)
        finally:
            sender.join(timeout=60)
    assert "error" not in outcome, outcome
    reply = outcome["reply"]
    assert isinstance(reply, dict)
    assert reply["duplicate"] is True
    assert reply["key"] == "kb"
    assert reply["text"] == "echo: block-after-x"  # the result, answered from the log
    assert reply["token"] == before["token"]
    assert isinstance(reply["state"], dict)
    assert reply["state"]["pid"] != pid  # the new worker answered it
    assert log_user_keys(node.home, "s") == ["k0", "kb"]


def test_a_stalled_handshake_and_a_plaintext_client_do_not_stall_the_session(node: Node) -> None:
    with node.cluster() as cluster:
        cluster.create("s")
        cluster.send("s", "one", key="k1")
        stalled = node.past_the_check("s")  # and never a ClientHello for the worker
        try:
            poll_until(lambda: worker_peers(node.home, "s")["handshakes"] == 1,
                       what="the stalled handshake in the worker")  # fmt: skip
            with node.past_the_check("s") as plain:
                request = {"id": 1, "op": "request", "request": {"text": "x", "key": "plain"}}
                plain.sendall(encode(request))
                received = b""
                try:
                    while chunk := plain.recv(4096):
                        received += chunk
                except ConnectionResetError:
                    pass
            assert not received.startswith(b"\x00")  # no frame of ours: at most a TLS alert
            assert b"echo" not in received
            # Served meanwhile: the connection of before, and a new one's handshake.
            assert cluster.send("s", "two", key="k2")["duplicate"] is False
            with node.cluster() as other:
                assert other.send("s", "three", key="k3")["duplicate"] is False
            peers = worker_peers(node.home, "s")
            assert peers["handshakes"] == 1, peers  # the stalled one is still waiting
            assert peers["tls"] >= 1, peers
        finally:
            stalled.close()
    assert log_user_keys(node.home, "s") == ["k1", "k2", "k3"]
    refusals = poll_until(lambda: node.worker_refusals("s") or None, what="the worker's line")
    assert any("not a TLS 1.3 handshake" in line for line in refusals), refusals


def test_a_node_certificate_may_not_send_on_the_direct_path(node: Node) -> None:
    with node.cluster() as cluster:
        cluster.create("s")
    posing = node.certs.issue("b", Role.NODE)
    with node.cluster(posing) as as_node, pytest.raises(ControlError) as caught:
        as_node.send("s", "stolen", key="kn")
    assert caught.value.code == "forbidden"
    assert "loopd-node" in one_line(caught.value)
    # Refused by the node's TLS thread at its check: nothing reached the worker.
    lines = poll_until(lambda: node.node_refusals() or None, what="the node's line")
    assert len(lines) == 1, lines
    assert "loopd-node" in lines[0], lines
    assert node.worker_refusals("s") == []
    assert log_user_keys(node.home, "s") == []
    with node.cluster() as cluster:
        assert cluster.send("s", "fine", key="k1")["duplicate"] is False


def test_a_client_of_another_ca_is_refused_on_the_direct_path(node: Node) -> None:
    with node.cluster() as cluster:
        cluster.create("s")
    intruder = node.certs.issue("intruder", Role.CLIENT, ca=trustme.CA())
    with node.cluster(intruder, timeout=10) as bad, pytest.raises(ControlError) as caught:
        bad.send("s", "stolen", key="kx")
    assert caught.value.code in ("tls_refused", "closed")
    assert "node a" in one_line(caught.value)
    lines = poll_until(lambda: node.node_refusals() or None, what="the node's line")
    assert all("certificate refused" in line for line in lines), lines
    assert node.worker_refusals("s") == []
    assert log_user_keys(node.home, "s") == []
    with node.cluster() as cluster:
        assert cluster.send("s", "fine", key="k1")["duplicate"] is False


def test_a_handoff_that_cannot_be_made_is_answered_over_tls_in_one_line(node: Node) -> None:
    # An operator's certificate: a client's is told ``forbidden`` of a session that is not
    # there, as of another tenant's (tests/gateway/test_tls_tenants.py).
    operator = node.certs.issue("alice", Role.OPERATOR)
    link = DirectLink(node.address, "a", "nosuch", operator, timeout=10)
    try:
        reply: Message = link.request({"text": "x", "key": "k"})
    finally:
        link.close()
    failure = reply.get("error")
    assert reply.get("ok") is False, reply
    assert isinstance(failure, dict), reply
    assert failure["code"] == "not_found"
    assert "nosuch" in str(failure["message"])
    assert "\n" not in str(failure["message"])


def test_a_client_that_starts_tls_at_once_is_still_relayed(node: Node) -> None:
    """The port's first byte tells the two paths apart: TLS at once is relayed as before,
    and both paths share the session's keys."""
    with node.cluster() as cluster:
        cluster.create("s")
        link = NodeLink(node.address, "a", node.client, timeout=10)
        try:
            relayed = link.call("send", session="s", text="hi", key="r1")
        finally:
            link.close()
        assert isinstance(relayed, dict)
        assert relayed["text"] == "echo: hi"
        assert worker_peers(node.home, "s")["tls"] == 0  # relayed: no TCP peer of the worker
        again = cluster.send("s", "hi", key="r1")
        assert again["duplicate"] is True
        assert again["token"] == relayed["token"]
        assert worker_peers(node.home, "s")["tls"] == 1


def test_a_hibernated_session_is_woken_by_a_tcp_connection_to_its_worker(
    hibernating_node: Node,
) -> None:
    """The worker stopped idle (its TCP connection ended with it): the client's next send
    makes a new connection, whose handoff starts the session, and the new worker holds it."""
    node = hibernating_node
    with node.cluster() as cluster:
        cluster.create("s")
        first = cluster.send("s", "one", key="k1")
        poll_until(lambda: status(node.home, "s")["state"] == "IDLE", what="the session IDLE")
        second = cluster.send("s", "two", key="k2")
        assert worker_peers(node.home, "s")["tls"] == 1  # well inside the 3 s idle stop
    assert second["duplicate"] is False
    assert isinstance(first["state"], dict)
    assert isinstance(second["state"], dict)
    assert second["state"]["pid"] != first["state"]["pid"]
    assert log_user_keys(node.home, "s") == ["k1", "k2"]


def test_handshakes_that_never_finish_cannot_keep_a_client_out(node: Node) -> None:
    """At the worker's limit a new handshake closes the oldest: peers that only send the
    preamble never lock a session's clients out."""
    from worker.loop.tls_peer import MAX_HANDSHAKES

    with node.cluster() as cluster:
        cluster.create("s")
        cluster.send("s", "one", key="k1")
        stalled: list[socket.socket] = []
        try:
            for _ in range(MAX_HANDSHAKES):
                stalled.append(node.past_the_check("s"))
                poll_until(lambda: worker_peers(node.home, "s")["handshakes"] == len(stalled),
                           what="the stalled handshakes in the worker")  # fmt: skip
            with node.cluster() as other:  # a new client's handshake closes the oldest
                assert other.send("s", "two", key="k2")["duplicate"] is False
            stalled[0].settimeout(10)
            with contextlib.suppress(ConnectionResetError):  # closed by the worker
                assert stalled[0].recv(1) == b""
            assert worker_peers(node.home, "s")["handshakes"] == MAX_HANDSHAKES - 1
        finally:
            for raw in stalled:
                raw.close()
    lines = node.worker_refusals("s")
    assert any("closed for a newer handshake" in line for line in lines), lines


def test_a_burst_of_clients_connecting_to_one_session_at_once_is_served_whole(
    node: Node,
) -> None:
    """Sixteen clients open their first connection to one session's worker at the same
    moment: every one is served and the worker never restarts (before, a worker made 4
    handshakes at once: the fifth closed the oldest, whose client got ``tls_refused``;
    and an attach read in the same turn as the closed handshake's event ended the
    worker on a closed descriptor)."""
    with node.cluster() as cluster:
        cluster.create("s")
        cluster.send("s", "warm", key="warm")
    pid = status(node.home, "s")["pid"]
    clients = [node.cluster() for _ in range(16)]  # certificates made here, in turn
    start = threading.Barrier(len(clients))
    outcomes: list[str] = []

    def send(n: int) -> None:
        start.wait()
        try:
            clients[n].send("s", "x", key=f"b{n}")
            outcomes.append("acknowledged")
        except ControlError as exc:
            outcomes.append(one_line(exc))

    threads = [threading.Thread(target=send, args=(n,)) for n in range(len(clients))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        for client in clients:
            client.close()
    assert outcomes == ["acknowledged"] * len(clients), outcomes
    assert status(node.home, "s")["pid"] == pid  # the same worker throughout
    assert sorted(str(key) for key in log_user_keys(node.home, "s")) == sorted(
        ["warm", *(f"b{n}" for n in range(len(clients)))])  # fmt: skip


def test_a_connection_closed_during_its_handshake_is_closed_not_refused(
    node: Node,
) -> None:
    """A peer that ends the connection in the middle of the TLS handshake (a worker that
    ended, or no longer serves the session) has refused no certificate: the client is
    told ``closed``, which it answers by looking the owner up again and sending again by
    key (before: ``tls_refused``, which it does not retry)."""
    listener = socket.create_server(("127.0.0.1", 0))
    ended = threading.Event()

    def close_mid_handshake() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(10)
            conn.recv(1 << 16)  # the preamble, and the ClientHello after it
            ended.set()

    thread = threading.Thread(target=close_mid_handshake)
    thread.start()
    link = DirectLink(f"tls://127.0.0.1:{listener.getsockname()[1]}", "a", "s", node.client,
                      timeout=10)  # fmt: skip
    try:
        with pytest.raises(ControlError) as raised:
            link.request({"text": "x", "key": "k"})
        assert raised.value.code == "closed", str(raised.value)
        assert "during its handshake" in raised.value.message, str(raised.value)
        assert ended.is_set()
    finally:
        link.close()
        thread.join(10)
        listener.close()
