"""The replication channel of a node's TLS port: an owner's link served by a thread of its own.

A gateway in this process (real sockets, real threads, certificates of a test CA): a
connection opening with ``REPLICA_PREAMBLE`` is handed to a thread of ``replica_link``,
which serves only a node certificate's replication ops; a peer that never ends its
handshake is dropped at the deadline and holds no thread after it; past the cap a link is
served by the gateway's loop instead, and no more threads are started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from supervisor.cluster.transport import REPLICA_PREAMBLE, Role, TlsFiles
from supervisor.daemon.replica_link import answer_replica
from supervisor.daemon.tls_gateway import TlsGateway
from tests.etcd_server import free_port
from tests.support import poll_until
from tests.test_replica_receiver_hostile import _steps
from tests.test_store_replica import BASELINE, T, _request
from tests.tls_certs import Certificates
from worker import Assistant, Owner, Session, ToolResult, User
from worker.follower_tls import TlsFollower, node_context
from worker.replication import MAX_STEP
from worker.ship_lanes import WINDOW, Lanes
from worker.store.replica_source import split_step, steps_after
from worker.store.replica_types import Step
from worker.wire import MAX_FRAME, FrameReader, Message, encode

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


@contextlib.contextmanager
def _node(root: Path, certs: Certificates, name: str) -> Iterator[Node]:
    home = root / name
    home.mkdir()
    lines: list[str] = []
    address = f"tls://127.0.0.1:{free_port()}"
    # The loop's path relays what it does not answer itself to the node's control socket:
    # one that listens (the kernel queues the relay's connection) is all it needs here.
    control = socket.socket(socket.AF_UNIX)
    control.bind(str(home / "x.sock"))
    control.listen()
    gateway = TlsGateway(address, certs.issue(name, Role.NODE), str(home / "x.sock"), lines.append)
    gateway.open()
    try:
        yield Node(gateway, certs, home, lines)
    finally:
        gateway.close()
        control.close()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    with _node(tmp_path, Certificates(tmp_path / "certs"), "a") as found:
        yield found
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


def _many_steps(owner_home: Path, requests: int) -> list[Step]:
    """The owner's log of ``requests`` requests as the steps it ships: a group each."""
    with Session.create(owner_home, "s", BASELINE) as owner:
        owner.append(Owner(node="a", token=5))
        for n in range(requests):
            _request(owner, n)
    steps: list[Step] = []
    for step in steps_after(owner_home, "s", None, 5):
        steps += [step] if step.is_epoch else split_step(step, 1)
    return steps


def test_an_owner_puts_more_steps_on_a_link_than_its_window_and_each_answer_lines_up(
    node: Node, tmp_path: Path
) -> None:
    """The worker's own thread sends each step (``ship_lanes``) and reads the answers
    after its fdatasync: more steps than ``WINDOW`` sent before one is read are all
    written, in order, and each answer is checked against the step it answers."""
    steps = _many_steps(tmp_path / "owner", 2 * WINDOW)
    first = next(n for n, step in enumerate(steps) if not step.is_epoch)
    files = node.certs.issue("o", Role.NODE)
    follower = TlsFollower("a", node.gateway.address, node_context(files.ca, files.cert, files.key))
    lanes = Lanes({"a": follower})
    try:
        for step in steps[:first]:  # the copy made, as a catch-up does: one at a time
            assert follower.ship(step) == step.end
        batch = steps[first:]
        assert len(batch) > WINDOW  # the window is filled at least once before a read
        lanes.send("a", batch)
        assert lanes.collect() == {"a": None}
        assert follower.position("s") == steps[-1].end
        # A step that does not continue the copy is answered as refused, the lane says
        # why, and the connection closes: the answers still to come line up with nothing.
        gap = dataclasses.replace(steps[-1], offset=steps[-1].end.size + 1)
        lanes.send("a", [gap, steps[-1]])  # the second is sent on, never answered
        (why,) = lanes.collect().values()
        assert why is not None
        assert "not_continuing" in why, why
        assert follower.position("s") == steps[-1].end  # a fresh connection, nothing lost
    finally:
        follower.close()


def _owner_link(node: Node, name: str, timeout: float) -> TlsFollower:
    files = node.certs.issue("o", Role.NODE)
    context = node_context(files.ca, files.cert, files.key)
    return TlsFollower(name, node.gateway.address, context, timeout=timeout)


def _delayed(node: Node, before: Callable[[Message], object]) -> None:
    """The node's link calls ``before`` with each replicate it is about to apply: a
    follower slow to write its copy, or one that stops answering."""
    answer = node.gateway.links.answer

    def slow(message: Message, names: list[str]) -> Message:
        if message.get("op") == "replicate":
            before(message)
        return answer(message, names)

    node.gateway.links.answer = slow


@pytest.mark.parametrize(("per_step", "acknowledged"), [(0.15, True), (0.4, False)])
def test_a_write_waits_for_its_followers_about_one_timeout_however_many_steps_it_has(
    node: Node, tmp_path: Path, per_step: float, acknowledged: bool
) -> None:
    """Four steps sent at once to a follower slow at each, with a 1 s timeout: answered
    in 0.6 s in all they are acknowledged; in 1.6 s, the follower is dropped at about
    1 s (each answer is due 1 s after the later of its send and the owner's wait
    beginning: a follower slow at every step but never silent for 1 s held a write for
    four times the timeout when each answer was due 1 s after the one before it)."""
    steps = _many_steps(tmp_path / "owner", 4)
    follower = _owner_link(node, "a", timeout=1.0)
    lanes = Lanes({"a": follower}, timeout=1.0)
    try:
        assert follower.ship(steps[0]) == steps[0].end  # the copy made
        _delayed(node, lambda _message: time.sleep(per_step))  # a slow fdatasync
        lanes.send("a", steps[1:5])
        (why,) = lanes.collect().values()
        if acknowledged:
            assert why is None
        else:
            assert why is not None
            assert "no answer within 1 s" in why, why
        node.gateway.links.answer = lambda message, names: answer_replica(
            node.gateway.replicas, None, message, names)  # fmt: skip
        # What was sent is written, in order (the dropped link's thread still applies
        # the frames it had read when the owner closed it).
        poll_until(lambda: follower.position("s") == steps[4].end, what="the copy's end")
    finally:
        follower.close()


def test_a_follower_that_stops_answering_fails_alone_and_the_others_answer_counts(
    node: Node, tmp_path: Path
) -> None:
    """One deadline for the answers of every follower: the one that does not answer is
    failed at it, and the answer of the other, read after that wait, still counts."""
    steps = _many_steps(tmp_path / "owner", 2)
    go = threading.Event()
    with _node(tmp_path, node.certs, "b") as other:
        silent, fast = _owner_link(node, "a", timeout=1.0), _owner_link(other, "b", 1.0)
        lanes = Lanes({"a": silent, "b": fast}, timeout=1.0)  # "a" is read first
        try:
            for follower in (silent, fast):
                assert follower.ship(steps[0]) == steps[0].end
            _delayed(node, lambda _message: go.wait(10))  # "a" stops answering
            for name in ("a", "b"):
                lanes.send(name, steps[1:2])
            started = time.monotonic()
            results = lanes.collect()
            assert time.monotonic() - started < 5.0
            assert results["b"] is None, results
            why = results["a"]
            assert why is not None
            assert "no answer within 1 s" in why, why
            assert fast.position("s") == steps[1].end
        finally:
            go.set()
            silent.close()
            fast.close()


def test_a_group_commit_larger_than_a_client_frame_is_shipped_whole(
    node: Node, tmp_path: Path
) -> None:
    """One request under a client's 1 MiB frame can make a group of several times its
    size (the default App's request, tool result and reply each carry the text); a step
    is never cut inside a group, so the replication link carries frames past 1 MiB
    (before, such a group could not be shipped at all: both followers were dropped and
    every later write refused, for good)."""
    home = tmp_path / "owner"
    text = "x" * 400_000
    with Session.create(home, "s", BASELINE) as owner:
        owner.append(Owner(node="a", token=5))
        owner.append_many(
            [
                User(time=T, text=text, key="big"),
                ToolResult(time=T, call=1, tool="echo", output=text, ok=True),
                Assistant(time=T, text=text),
            ]
        )
    steps: list[Step] = []
    for step in steps_after(home, "s", None, 5):
        steps += [step] if step.is_epoch else split_step(step, MAX_STEP)
    assert max(len(step.data) for step in steps) > MAX_FRAME  # one group, never cut
    follower = _owner_link(node, "a", timeout=10.0)
    lanes = Lanes({"a": follower})
    try:
        assert follower.ship(steps[0]) == steps[0].end
        lanes.send("a", steps[1:])
        assert lanes.collect() == {"a": None}
        assert follower.position("s") == steps[-1].end
    finally:
        follower.close()
