"""What a killed replicated move leaves behind, finished or cleared by a rerun, checked on
a real etcd with the nodes' own step functions on real homes (docs/scaling.md 9.5)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.etcd_types import Put
from supervisor.cluster.keys import encode_value, node_key, node_value, owner_key, placement_key
from supervisor.cluster.move import MoveIntent
from supervisor.cluster.replica_move import move_replicated, moved_key
from supervisor.cluster.replica_move_node import promote_here
from supervisor.cluster.replica_set import ReplicaSet, replicas_key
from tests.etcd_server import EtcdServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdClient]:
    server = EtcdServer(tmp_path / "etcd")
    server.start()
    try:
        with EtcdClient(server.url) as client:
            yield client
    finally:
        server.stop()


class NodeSteps:
    """A mover's calls to nodes a, b, c, d, each made by that node's own step function on
    its home (``promote``), or recorded (every other step)."""

    def __init__(self, client: EtcdClient, root: Path) -> None:
        self.client = client
        self.homes = {name: root / name for name in "abcd"}
        self.made: list[tuple[str, str]] = []
        for name, home in self.homes.items():
            home.mkdir()
            value = encode_value({"address": f"tls://127.0.0.1:{1000 + ord(name)}",
                                  "home": str(home)})  # fmt: skip
            client.put(node_key(name), value)

    def __call__(self, node: str, op: str, session: str) -> object:
        self.made.append((node, op))
        if op == "promote":
            return promote_here(self.client, node, str(self.homes[node]), session)
        return None


def test_a_handover_left_unfinished_then_failed_over_elsewhere_is_cleared_not_promoted(
    etcd: EtcdClient, tmp_path: Path
) -> None:
    """Mover killed after ``own`` (a to b), then b lost and c took over: a rerun's leftover
    ``/loopd/moved/r`` names b, which owns nothing; it is cleared, and b not promoted."""
    steps = NodeSteps(etcd, tmp_path)
    intent = MoveIntent(session="r", source="a", target="b", token=6,
                        source_home=str(steps.homes["a"]), target_home=str(steps.homes["b"]),
                        replicated=True)  # fmt: skip
    etcd.put(moved_key("r"), intent.encode())
    etcd.put(owner_key("r"), node_value("c"))
    etcd.put(placement_key("r"), node_value("c"))
    etcd.put(replicas_key("r"), ReplicaSet(3, ("a", "d"), ("a", "d")).value())
    done = move_replicated(etcd, "r", "c", steps)  # c owns it: nothing but the leftover
    assert done.node == "c"
    assert etcd.get(moved_key("r")) is None
    assert ("b", "promote") not in steps.made
    assert ("b", "adopt") not in steps.made
    assert ("a", "demote") in steps.made  # the old owner's step is still made (etcd-checked)


def test_a_leftover_whose_target_still_owns_it_is_promoted_there(
    etcd: EtcdClient, tmp_path: Path
) -> None:
    steps = NodeSteps(etcd, tmp_path)
    intent = MoveIntent(session="r", source="a", target="b", token=6,
                        source_home=str(steps.homes["a"]), target_home=str(steps.homes["b"]),
                        replicated=True)  # fmt: skip
    etcd.put(moved_key("r"), intent.encode())
    etcd.txn([], [Put(key=owner_key("r"), value=node_value("b")),
                  Put(key=placement_key("r"), value=node_value("b"))])  # fmt: skip
    etcd.put(replicas_key("r"), ReplicaSet(3, ("a", "c"), ("a", "c")).value())
    (steps.homes["b"] / "sessions" / "r").mkdir(parents=True)  # promoted by its watch already
    move_replicated(etcd, "r", "b", steps)
    assert ("b", "promote") in steps.made
    assert ("b", "adopt") in steps.made
    assert etcd.get(moved_key("r")) is None
