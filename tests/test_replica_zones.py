"""Zones in placement: a replicated session's copies go to different zones while there
are enough (``loopd serve --zone``, ``zone`` in loopd.toml), and ``loopd status
--cluster`` says where they share one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import decode_value, node_key
from tests.replica_nodes import Nodes, running_nodes
from tests.support import loopd

pytestmark = pytest.mark.timeout(100)
ZONES = {"a": "z1", "b": "z1", "c": "z2", "d": "z3"}


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    with running_nodes(tmp_path / "rz", ZONES) as cluster:
        yield cluster


def test_copies_go_to_other_zones_and_status_says_when_too_few(nodes: Nodes) -> None:
    with EtcdClient(nodes.etcd.url) as etcd:  # registered with each node, the file's too
        for name, zone in ZONES.items():
            kv = etcd.get(node_key(name))
            assert kv is not None
            assert decode_value(kv.value)["zone"] == zone
    with nodes.client() as client:
        client.create("r")  # 3 copies, 3 zones: each in its own, wherever it is created
        owner = nodes.owner()[0]
        copies = [owner, *nodes.replica_set().followers]
        assert sorted(ZONES[n] for n in copies) == ["z1", "z2", "z3"]
        client.create("s", replicas=4)  # 4 copies, 3 zones: two share one
    env = nodes.operator_env()
    shown = loopd("status", "--cluster", nodes.etcd.url, "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    rows = {row["session"]: row for row in json.loads(shown.stdout)}
    assert rows["r"]["zones"] == ",".join(ZONES[n] for n in copies)
    assert rows["s"]["zones"].endswith("(shared)")
    assert sorted(rows["s"]["zones"].removesuffix("(shared)").split(",")) == [
        "z1", "z1", "z2", "z3"
    ]  # fmt: skip
    table = loopd("status", "--cluster", nodes.etcd.url, env=env)
    assert table.stdout.splitlines()[0].split()[:5] == [
        "session", "node", "followers", "in_sync", "zones"
    ]  # fmt: skip


def test_a_bad_zone_name_is_one_line(tmp_path: Path) -> None:
    home = tmp_path / "h"
    home.mkdir()
    served = loopd("serve", "--home", str(home), "--cluster", "http://127.0.0.1:9",
                   "--node", "a", "--zone", "no good")  # fmt: skip
    assert served.returncode != 0
    (line,) = served.stderr.splitlines()
    assert "--zone" in line
    assert "no good" in line
