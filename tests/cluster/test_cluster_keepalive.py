"""A node whose etcd answers badly for a while serves again once etcd is healthy, and stops cleanly.

Real daemons talk to a fake etcd (tests/harness/fake_etcd.py) that forwards to a real one, or
answers with a bad reply instead: a 503 "leader changed", a body that is not JSON, a
lease reply whose TTL is not an integer.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.client import Client, call
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import node_key
from supervisor.errors import ControlError
from tests.harness.etcd_server import EtcdServer
from tests.harness.fake_etcd import (
    LEADER_CHANGED,
    LEASE_PATHS,
    NOT_JSON,
    TTL_NOT_INTEGER,
    BadReply,
    FakeEtcd,
)
from tests.harness.support import Daemon, poll_until

TTL = 3


@pytest.fixture
def fake(etcd: EtcdServer) -> Iterator[FakeEtcd]:
    server = FakeEtcd(etcd.url)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def node(fake: FakeEtcd, tmp_path: Path) -> Iterator[Daemon]:
    daemon = Daemon(tmp_path / "a", "--cluster", fake.url, "--node", "a", "--lease-ttl", str(TTL))
    try:
        yield daemon
    finally:
        daemon.stop()


def _lease_expired(etcd: EtcdServer) -> bool:
    with EtcdClient(etcd.url) as real:
        return real.get(node_key("a")) is None


@pytest.mark.parametrize(
    ("reply", "paths"),
    [
        (LEADER_CHANGED, frozenset()),
        (NOT_JSON, frozenset()),
        (TTL_NOT_INTEGER, LEASE_PATHS),
    ],
    ids=["503-leader-changed", "not-json", "ttl-not-integer"],
)
def test_a_node_serves_its_sessions_again_once_etcd_recovers_from_bad_replies(
    etcd: EtcdServer, fake: FakeEtcd, node: Daemon, reply: BadReply, paths: frozenset[str]
) -> None:
    call(str(node.home), "create", session="s1", timeout=20)
    with Client(str(node.home), timeout=10, retry_for=0.1) as direct:
        token = direct.send("s1", "one", key="k1")["token"]
        assert isinstance(token, int)
        fake.answer(reply, paths)

        def refused() -> str | None:
            try:
                direct.send("s1", "probe", key="probe")
            except ControlError as exc:
                return exc.code
            return None

        assert poll_until(refused, timeout=10, what="a refusal") == "not_owner"
        # Long enough for the lease to expire in etcd; then the node hears so (its
        # keepalive reaches etcd) and must register anew, and its new lease grants get
        # the bad reply too.
        poll_until(lambda: _lease_expired(etcd), timeout=15, what="the lease to expire")
        fake.answer(reply, frozenset({"/v3/lease/grant"}))
        poll_until(
            lambda: fake.answered.get("/v3/lease/grant", 0) >= 2,
            timeout=10,
            what="bad replies to the node's new lease grants",
        )
        fake.forward()

        def served_again() -> int | None:
            try:
                new = direct.send("s1", "two", key="k2")["token"]
            except ControlError:
                return None
            return new if isinstance(new, int) else None

        assert poll_until(served_again, timeout=30, what="the session to serve again") > token
    assert "Traceback" not in node.log_path.read_text()


def test_a_node_stopped_by_sigterm_after_its_lease_was_lost_ends_cleanly(
    etcd: EtcdServer, fake: FakeEtcd, node: Daemon
) -> None:
    call(str(node.home), "create", session="s1", timeout=20)
    fake.answer(LEADER_CHANGED, LEASE_PATHS)  # no keepalive, no new lease; the rest goes through
    poll_until(lambda: _lease_expired(etcd), timeout=15, what="the lease to expire")
    node.proc.send_signal(signal.SIGTERM)
    try:
        code = node.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        code = None
    log = node.log_path.read_text()
    assert code == 0, log
    assert "Traceback" not in log
