"""A zombie node: SIGSTOPped past its lease, replaced by a takeover, then SIGCONTed."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.scenarios.scenarios import SESSION
from supervisor.cluster.errors import StaleOwner
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import node_value, placement_key
from supervisor.cluster.ownership import owner_of
from supervisor.cluster.routing import TokenGuard
from supervisor.moves.takeover import take_over
from tests.harness.cluster_support import APP, TTL, NodeProcess, register, send
from tests.harness.etcd_server import EtcdServer
from tests.harness.support import poll_until, stop
from worker import Session
from worker.store.disk.layout import session_dir


@pytest.fixture
def client(etcd: EtcdServer) -> Iterator[EtcdClient]:
    with EtcdClient(etcd.url) as client:
        yield client


def test_a_zombie_node_acknowledges_nothing_after_a_takeover_and_quarantines_its_copy(
    etcd: EtcdServer, client: EtcdClient, tmp_path: Path
) -> None:
    home_a = tmp_path / "a"
    Session.create(home_a, SESSION, APP.initial_baseline(SESSION), slot=7).close()
    client.put(placement_key(SESSION), node_value("a"))
    guard = TokenGuard()
    zombie = NodeProcess(etcd.url, "a", home_a)
    b = None
    try:
        token_a = zombie.claims["served"][SESSION]  # type: ignore[index]
        reply = zombie.send("k1")
        assert reply == {"ok": True, "key": "k1", "token": token_a}
        guard.check(SESSION, token_a)

        stop(zombie.process)
        poll_until(lambda: owner_of(client, SESSION) is None, timeout=TTL * 5, what="lease expiry")
        backup = tmp_path / "backup"
        shutil.copytree(session_dir(home_a, SESSION), backup)
        b = register(client, "b", tmp_path / "b")
        token_b = take_over(client, SESSION, str(backup), "b").token
        assert token_b > token_a
        send(b.home, SESSION, "k2")
        guard.check(SESSION, token_b)

        os.kill(zombie.process.pid, signal.SIGCONT)
        late = zombie.send("k3")
        assert late["ok"] is False
        assert "not_owner" in str(late["error"])
        # Had a late reply carried the zombie's token, the client would refuse it.
        with pytest.raises(StaleOwner, match=f"its token {token_a} is lower than {token_b}"):
            guard.check(SESSION, token_a)
        poll_until(
            lambda: not Path(session_dir(home_a, SESSION)).exists(),
            timeout=TTL * 5,
            what="the zombie to quarantine its copy",
        )
        assert len(list((home_a / "quarantine").iterdir())) == 1
        assert zombie.send("k4")["ok"] is False
        owner = owner_of(client, SESSION)
        assert owner is not None
        assert (owner.node, owner.token) == ("b", token_b)
        with Session.open(b.home, SESSION) as served:
            assert served.find_key("k1") is not None
            assert served.find_key("k2") is not None
            assert served.find_key("k3") is None
    finally:
        os.kill(zombie.process.pid, signal.SIGCONT)
        zombie.stop()
        if b is not None:
            b.lease.close()


def test_a_node_acknowledges_no_write_while_etcd_is_down_and_resumes_when_it_returns(
    etcd: EtcdServer, client: EtcdClient, tmp_path: Path
) -> None:
    home = tmp_path / "a"
    Session.create(home, SESSION, APP.initial_baseline(SESSION), slot=7).close()
    client.put(placement_key(SESSION), node_value("a"))
    node = NodeProcess(etcd.url, "a", home)
    try:
        assert node.send("k1")["ok"] is True
        etcd.stop()

        def refused() -> dict[str, object] | None:
            reply = node.send("probe")
            return reply if reply["ok"] is False else None

        assert "not_owner" in str(
            poll_until(refused, timeout=TTL * 2, what="the node to stop acknowledging")["error"]
        )
        etcd.start()
        poll_until(lambda: node.send("k2")["ok"] is True, timeout=15, what="acknowledging again")
    finally:
        node.stop()
    with Session.open(home, SESSION) as opened:
        assert opened.find_key("k1") is not None
        assert opened.find_key("k2") is not None
