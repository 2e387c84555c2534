"""Three nodes on one machine: sessions created through the cluster, each with one owner."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import PREFIX
from supervisor.cluster.routing import TokenGuard, route
from supervisor.node.drain import least_loaded_node
from supervisor.node.node import ClusterNode
from tests.harness.cluster_support import APP, send
from tests.harness.etcd_server import EtcdServer
from worker import Session
from worker.store.disk.layout import session_dir

SESSIONS = 60


@pytest.fixture
def cluster(etcd: EtcdServer, tmp_path: Path) -> Iterator[dict[str, ClusterNode]]:
    clients = [EtcdClient(etcd.url) for _ in range(3)]
    nodes = {
        name: ClusterNode(c, name, tmp_path / name) for name, c in zip("abc", clients, strict=True)
    }
    for node in nodes.values():
        node.start()
    yield nodes
    for node in nodes.values():
        node.close()
    for c in clients:
        c.close()


def test_sixty_sessions_on_three_nodes_have_one_owner_each_reached_from_any_entry_point(
    etcd: EtcdServer, cluster: dict[str, ClusterNode]
) -> None:
    with EtcdClient(etcd.url) as client:
        for n in range(SESSIONS):
            session = f"s{n}"
            cluster[least_loaded_node(client)].create(session, APP.initial_baseline(session))
        owners = client.range(f"{PREFIX}owner/", prefix=True)
        assert len(owners) == SESSIONS
    per_node = {name: 0 for name in cluster}
    guard = TokenGuard()
    for n in range(SESSIONS):
        session = f"s{n}"
        holders = [
            name for name, node in cluster.items() if Path(session_dir(node.home, session)).is_dir()
        ]
        assert len(holders) == 1
        # Every node is an entry point: each resolves the session to the same owner.
        found = {name: route(node.client, session) for name, node in cluster.items()}
        assert {(r.node, r.token) for r in found.values()} == {(holders[0], found["a"].token)}
        owner = cluster[holders[0]]
        assert owner.can_acknowledge(session, found["a"].token)
        assert [
            name for name, node in cluster.items() if node.token_of(session) is not None
        ] == holders
        send(Path(owner.home), session, f"key-{session}")
        guard.check(session, found["a"].token)
        with Session.open(owner.home, session) as opened:
            assert opened.fence.token == found["a"].token
        per_node[holders[0]] += 1
    assert per_node == {"a": 20, "b": 20, "c": 20}
