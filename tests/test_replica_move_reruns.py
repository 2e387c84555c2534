"""Replicated moves after what a killed or earlier move left, on real daemons (four
``loopd serve`` nodes with TLS ports, a real etcd, a session of 3 copies); each runs
with ``-m cluster_sweep`` (docs/scaling.md 9.5, "Reruns and leftovers")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.ownership import owner_of
from supervisor.cluster.replica_move import ReplicaStep, moved_key
from tests.replica_nodes import NAMES, Nodes, running_nodes
from tests.support import loopd, poll_until
from tests.test_replica_move import _served, _write_keys

pytestmark = [pytest.mark.timeout(150), pytest.mark.cluster_sweep]


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    with running_nodes(tmp_path / "rr") as cluster:
        yield cluster


def _owner_other_than(nodes: Nodes, node: str) -> str | None:
    with EtcdClient(nodes.etcd.url) as etcd:
        owner = owner_of(etcd, "r")
    return owner.node if owner is not None and owner.node != node else None


def test_a_handover_left_unfinished_then_failed_over_elsewhere_blocks_no_later_move(
    nodes: Nodes,
) -> None:
    env = nodes.operator_env()
    with nodes.client() as client:
        client.create("r")
        target = nodes.replica_set().in_sync[0]
        _write_keys(client, range(2))
        killed = subprocess.run(  # after `own`: /loopd/moved/r left, naming the target
            [sys.executable, "-m", "tests.replica_mover", nodes.etcd.url, "r", target,
             ReplicaStep.RELEASE.value],
            capture_output=True, text=True, timeout=60, env={**os.environ, **env}, check=False,
        )  # fmt: skip
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        poll_until(lambda: _served(client, "k-probe"), what="r served by the target's watch")
        nodes.kill(target)
        third = poll_until(lambda: _owner_other_than(nodes, target), timeout=30,
                           what="a failover away from the target")  # fmt: skip
        other = next(n for n in nodes.replica_set().in_sync if n != third)
        moved = loopd("move", "--cluster", nodes.etcd.url, "r", "--to", other, env=env)
        assert moved.returncode == 0, moved.stderr
        assert json.loads(moved.stdout)["node"] == other
        with EtcdClient(nodes.etcd.url) as etcd:
            assert etcd.get(moved_key("r")) is None
        for n in range(2):
            assert client.send("r", f"t{n}", key=f"k{n}")["duplicate"] is True


def test_a_node_the_session_moved_away_from_follows_it_and_owns_it_again(nodes: Nodes) -> None:
    env = nodes.operator_env()
    url = nodes.etcd.url
    with nodes.client() as client:
        client.create("r")
        owner, _token = nodes.owner()
        first = nodes.replica_set()
        b = first.in_sync[0]
        spare = next(n for n in NAMES if n != owner and n not in first.followers)
        _write_keys(client, range(2))
        for to in (b, spare, b):  # b promotes it, its copy leaves, then it is added back
            moved = loopd("move", "--cluster", url, "r", "--to", to, env=env)
            assert moved.returncode == 0, moved.stderr
            assert nodes.owner()[0] == to
        for n in range(2):
            assert client.send("r", f"t{n}", key=f"k{n}")["duplicate"] is True
