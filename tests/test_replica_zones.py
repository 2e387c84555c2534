"""Zones in placement: a replicated session's copies go to different zones while there
are enough (``loopd serve --zone``, ``zone`` in loopd.toml), and ``loopd status
--cluster`` says where they share one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import decode_value, encode_value, node_key
from supervisor.cluster.replica_placement import (
    ReplicasUnavailable,
    choose_followers,
    new_copy_node,
)
from supervisor.cluster.replica_set import ReplicaSet
from tests.etcd_server import EtcdServer
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


def test_placement_prefers_unused_zones_then_takes_any(etcd: EtcdServer) -> None:
    with EtcdClient(etcd.url) as client:
        registered = {"a": "z1", "b": "z1", "c": "z2", "d": None, "e": "z3", "f": "z3"}
        for name, zone in registered.items():
            value: dict[str, object] = {"address": f"tls://127.0.0.1:{7000 + ord(name)}",
                                        "home": f"/h/{name}"}  # fmt: skip
            if zone is not None:
                value["zone"] = zone
            client.put(node_key(name), encode_value(value))
        assert choose_followers(client, "r", "a", 3) == ["c", "e"]  # by name: b, c
        assert choose_followers(client, "r", "c", 3) == ["a", "e"]
        # 5 copies, 3 zones: one per zone first, then the rest by name (d names none).
        assert choose_followers(client, "r", "a", 5) == ["c", "e", "b", "d"]
        # A new copy in place of a leaving one goes to a zone no staying copy is in.
        current = ReplicaSet(3, ("b", "c"), ("b", "c"))
        assert new_copy_node(client, "r", "a", current, {"b"}) == "e"
        assert new_copy_node(client, "r", "a", current, {"c"}) == "e"
        full = ReplicaSet(6, ("b", "c", "d", "e", "f"), ())
        with pytest.raises(ReplicasUnavailable, match="session r: its 6 copies need another"):
            new_copy_node(client, "r", "a", full, {"f"})
