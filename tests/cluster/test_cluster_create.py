"""A cluster ``create`` (and ``adopt``) never blocks the daemon's loop and never says ``exists``
for a session etcd could not place: etcd stopped, answering one byte a second, or
losing its reply."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.client import call
from supervisor.client.cluster import ClusterClient
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.ownership import owner_of
from supervisor.errors import ControlError
from supervisor.node.serving import CALL_TIMEOUT
from tests.harness.etcd_server import EtcdServer
from tests.harness.fake_etcd import LEADER_CHANGED, FakeEtcd, dripping
from tests.harness.support import Daemon, poll_until, status


@pytest.fixture
def fake(etcd: EtcdServer) -> Iterator[FakeEtcd]:
    server = FakeEtcd(etcd.url)
    try:
        yield server
    finally:
        server.close()


def _created(home: Path, session: str) -> bool:
    try:
        call(str(home), "create", session=session, timeout=20)
    except ControlError as exc:
        if exc.code in ("unavailable", "not_owner"):  # etcd back, the lease not yet
            return False
        raise
    return True


def test_a_create_while_etcd_is_stopped_answers_unavailable_and_works_once_it_returns(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    daemon = Daemon(tmp_path / "a", "--cluster", etcd.url, "--node", "a", "--lease-ttl", "3")
    try:
        etcd.stop()
        with pytest.raises(ControlError, match="etcd unavailable") as caught:
            call(str(daemon.home), "create", session="s1", timeout=20)
        assert caught.value.code == "unavailable"
        assert not (daemon.home / "sessions" / "s1").exists()
        etcd.start()
        poll_until(lambda: _created(daemon.home, "s1"), timeout=30, what="a create")
        assert status(daemon.home, "s1")["session"] == "s1"
    finally:
        daemon.stop()


def test_a_create_whose_etcd_reply_was_lost_can_be_retried_on_the_same_node(
    etcd: EtcdServer, fake: FakeEtcd, tmp_path: Path
) -> None:
    daemon = Daemon(tmp_path / "a", "--cluster", fake.url, "--node", "a", "--lease-ttl", "3")
    try:
        fake.answer(LEADER_CHANGED, frozenset({"/v3/kv/txn"}), after_forwarding=True)
        with pytest.raises(ControlError) as caught:
            call(str(daemon.home), "create", session="s1", timeout=20)
        assert caught.value.code == "unavailable"
        with EtcdClient(etcd.url) as real:
            owner = owner_of(real, "s1")
        assert owner is not None
        assert owner.node == "a"  # etcd applied the placement; the node never heard of it
        fake.forward()
        call(str(daemon.home), "create", session="s1", timeout=20)
        assert status(daemon.home, "s1")["session"] == "s1"
        with pytest.raises(ControlError, match="already exists") as again:
            call(str(daemon.home), "create", session="s1", timeout=20)
        assert again.value.code == "exists"
    finally:
        daemon.stop()


def test_a_cluster_client_retries_a_create_whose_reply_was_lost_on_the_node_it_was_placed_on(
    etcd: EtcdServer, fake: FakeEtcd, tmp_path: Path
) -> None:
    a = Daemon(tmp_path / "a", "--cluster", fake.url, "--node", "a", "--lease-ttl", "3")
    b = None
    try:
        b = Daemon(tmp_path / "b", "--cluster", etcd.url, "--node", "b", "--lease-ttl", "3")
        fake.answer(LEADER_CHANGED, frozenset({"/v3/kv/txn"}), after_forwarding=True)
        with ClusterClient(etcd.url, timeout=20) as cluster:
            with pytest.raises(ControlError, match="nothing was created"):
                cluster.create("s1")  # on a: both hold none, a comes first
            fake.forward()
            cluster.create("s1")  # b now holds fewer, but s1 is placed on a
            assert cluster.send("s1", "hi", key="k1")["duplicate"] is False
        assert (a.home / "sessions" / "s1").is_dir()
        assert not (b.home / "sessions" / "s1").exists()
    finally:
        a.stop()
        if b is not None:
            b.stop()


@pytest.mark.parametrize("op", ["create", "adopt"])
def test_an_etcd_answering_a_byte_a_second_neither_blocks_the_loop_nor_the_call(
    fake: FakeEtcd, tmp_path: Path, op: str
) -> None:
    daemon = Daemon(tmp_path / "a", "--cluster", fake.url, "--node", "a", "--lease-ttl", "3")
    try:
        fake.answer(dripping(1.0))
        outcomes: list[tuple[str, float]] = []

        def call_in_thread() -> None:
            began = time.monotonic()
            try:
                call(str(daemon.home), op, session="s1", timeout=60)
            except ControlError as exc:
                outcomes.append((exc.code, time.monotonic() - began))
            else:
                outcomes.append(("ok", time.monotonic() - began))

        # Two at once: the second finds the first's etcd job in progress.
        callers = [threading.Thread(target=call_in_thread) for _ in range(2)]
        for caller in callers:
            caller.start()
        pings = 0
        try:
            while any(caller.is_alive() for caller in callers):
                call(str(daemon.home), "ping", timeout=1.0)  # the loop answers meanwhile
                pings += 1
        finally:
            for caller in callers:
                caller.join(timeout=60)
        assert pings > 0
        assert sorted(code for code, _ in outcomes) == ["busy", "unavailable"]
        # Each etcd call of it ends by its deadline, however slowly etcd answers.
        assert all(took < CALL_TIMEOUT * 4 + 2 for _, took in outcomes), outcomes
    finally:
        daemon.stop()
