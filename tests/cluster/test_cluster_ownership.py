"""Registration, fencing tokens, routing, claims and takeover against a real etcd."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.scenarios.scenarios import SESSION
from supervisor.cluster.errors import MoveFailed, NotOwner, StaleOwner
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import node_value, placement_key
from supervisor.cluster.lease import LeaseTiming, NodeNameTaken
from supervisor.cluster.ownership import acquire, owner_of, place_new
from supervisor.cluster.routing import TokenGuard, live_nodes, route, unix_socket_path
from supervisor.moves.takeover import take_over
from supervisor.node.node import LEASE_FILE, ClusterNode
from tests.harness.cluster_support import APP, create_session, register, send
from tests.harness.etcd_server import EtcdServer
from tests.harness.support import poll_until
from worker import Session
from worker.ipc.lease_deadline import lease_proven
from worker.store.disk.layout import session_dir


@pytest.fixture
def client(etcd: EtcdServer) -> Iterator[EtcdClient]:
    with EtcdClient(etcd.url) as client:
        yield client


def test_a_node_name_is_registered_once_while_its_lease_lives(
    client: EtcdClient, tmp_path: Path
) -> None:
    first = register(client, "a", tmp_path / "a")
    with pytest.raises(NodeNameTaken, match="node 'a' is already registered by a live node"):
        register(client, "a", tmp_path / "a2")
    first.lease.close()
    again = register(client, "a", tmp_path / "a2")
    assert live_nodes(client) == {"a": f"unix:{tmp_path / 'a2'}/loopd.sock"}
    again.lease.close()
    assert live_nodes(client) == {}


def test_a_new_session_is_placed_once_cluster_wide_with_a_token(
    client: EtcdClient, tmp_path: Path
) -> None:
    a, b = register(client, "a", tmp_path / "a"), register(client, "b", tmp_path / "b")
    token = place_new(client, "s1", "a", a.lease_id)
    with pytest.raises(
        NotOwner, match="session s1: not the owner: the session already exists on a"
    ):
        place_new(client, "s1", "b", b.lease_id)
    found = route(client, "s1")
    assert (found.node, found.token) == ("a", token)
    assert unix_socket_path(found.address) == f"{tmp_path / 'a'}/loopd.sock"
    a.lease.close()
    b.lease.close()


def test_ownership_lost_with_the_lease_is_reacquired_only_by_the_placed_node_with_a_higher_token(
    client: EtcdClient, tmp_path: Path
) -> None:
    a, b = register(client, "a", tmp_path / "a"), register(client, "b", tmp_path / "b")
    token = place_new(client, "s1", "a", a.lease_id)
    with pytest.raises(NotOwner, match=r"owned by a \(token"):
        acquire(client, "s1", "a", a.lease_id)
    a.lease.close()  # the node's lease ends: its owner keys vanish
    with pytest.raises(NotOwner, match="no node owns it now"):
        route(client, "s1")
    with pytest.raises(NotOwner, match="its files are placed on a, not on b"):
        acquire(client, "s1", "b", b.lease_id)
    a = register(client, "a", tmp_path / "a")
    assert acquire(client, "s1", "a", a.lease_id) > token
    a.lease.close()
    b.lease.close()


def test_the_token_guard_refuses_a_reply_with_a_lower_token_than_one_seen() -> None:
    guard = TokenGuard()
    guard.check("s", 10)
    guard.check("s", 12)
    with pytest.raises(StaleOwner, match="reply refused: its token 10 is lower than 12"):
        guard.check("s", 10)
    guard.check("other", 1)


def test_a_node_quarantines_a_copy_placed_on_another_node_and_claims_its_own(
    client: EtcdClient, tmp_path: Path
) -> None:
    home = tmp_path / "a"
    for session in ("mine", "theirs"):
        Session.create(home, session, APP.initial_baseline(session)).close()
    client.put(placement_key("mine"), node_value("a"))
    client.put(placement_key("theirs"), node_value("b"))
    node = ClusterNode(client, "a", home)
    try:
        claims = node.start()
        assert list(claims.served) == ["mine"]
        assert claims.quarantined == {"theirs": "placed on b, owned by b"}
        assert not Path(session_dir(home, "theirs")).exists()
        assert len(list((home / "quarantine").iterdir())) == 1
        with Session.open(home, "mine") as opened:
            assert (opened.fence.node, opened.fence.token) == ("a", claims.served["mine"])
        assert node.can_acknowledge("mine", claims.served["mine"])
    finally:
        node.close()
    assert not node.can_acknowledge("mine", claims.served["mine"])


def test_a_node_stops_acknowledging_while_etcd_is_down_and_resumes_when_it_returns(
    etcd: EtcdServer, client: EtcdClient, tmp_path: Path
) -> None:
    home = tmp_path / "a"
    Session.create(home, "s", APP.initial_baseline("s")).close()
    client.put(placement_key("s"), node_value("a"))
    timing = LeaseTiming(ttl=3)
    with EtcdClient(etcd.url, timeout=0.3) as own:
        node = ClusterNode(own, "a", home, timing=timing)
        try:
            token = node.start().served["s"]
            lease_file = (home / LEASE_FILE).open("rb")
            assert node.can_acknowledge("s", token)
            assert lease_proven(lease_file.fileno())
            etcd.stop()
            poll_until(
                lambda: not node.can_acknowledge("s", token),
                timeout=timing.renew_deadline + 2,
                what="the node to stop acknowledging",
            )
            assert not lease_proven(lease_file.fileno())  # what its workers read: the same
            etcd.start()
            poll_until(
                lambda: node.can_acknowledge("s", token) and lease_proven(lease_file.fileno()),
                timeout=15,
                what="acknowledging again",
            )
            lease_file.close()
        finally:
            node.close()


def test_takeover_is_refused_while_the_owner_lives_and_installs_a_copy_once_it_is_gone(
    client: EtcdClient, tmp_path: Path
) -> None:
    a, b = register(client, "a", tmp_path / "a"), register(client, "b", tmp_path / "b")
    token = create_session(client, a, SESSION)
    send(a.home, SESSION, "k1")
    backup = tmp_path / "backup"
    shutil.copytree(session_dir(a.home, SESSION), backup)
    with pytest.raises(MoveFailed, match=r"a owns it .* its lease is alive"):
        take_over(client, SESSION, str(backup), "b")
    a.lease.close()  # node a is gone for good
    done = take_over(client, SESSION, str(backup), "b")
    assert done.token > token
    owner = owner_of(client, SESSION)
    assert owner is not None
    assert (owner.node, owner.token) == ("b", done.token)
    with Session.open(b.home, SESSION) as taken:
        assert taken.find_key("k1") is not None
        assert (taken.fence.node, taken.fence.token) == ("b", done.token)
    b.lease.close()


def test_takeover_refuses_a_torn_copy_and_leaves_nothing_installed(
    client: EtcdClient, tmp_path: Path
) -> None:
    a, b = register(client, "a", tmp_path / "a"), register(client, "b", tmp_path / "b")
    create_session(client, a, SESSION)
    a.lease.close()
    backup = tmp_path / "backup"
    shutil.copytree(session_dir(a.home, SESSION), backup)
    with (backup / "0.jsonl").open("ab") as f:
        f.write(b'{"type":"User","ti')
    with pytest.raises(
        MoveFailed, match=r"the copy is refused: .*0\.jsonl:3: last line has no newline"
    ):
        take_over(client, SESSION, str(backup), "b")
    assert not Path(session_dir(b.home, SESSION)).exists()
    assert owner_of(client, SESSION) is None
    b.lease.close()
