"""``loopd cordon`` / ``uncordon``, and ``drain`` cordoning first: real daemons as nodes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.client import call
from supervisor.client.cluster import ClusterClient
from supervisor.cluster.etcd import EtcdClient
from supervisor.errors import ControlError
from supervisor.node.drain import placements
from tests.harness.etcd_server import EtcdServer
from tests.harness.support import Daemon, loopd


@pytest.fixture
def daemons(etcd: EtcdServer, tmp_path: Path) -> Iterator[dict[str, Daemon]]:
    started: dict[str, Daemon] = {}
    try:
        for name in ("a", "b"):
            started[name] = Daemon(tmp_path / name, "--cluster", etcd.url, "--node", name)
        yield started
    finally:
        for daemon in started.values():
            daemon.stop()


def placed(etcd: EtcdServer) -> dict[str, str]:
    with EtcdClient(etcd.url) as client:
        return placements(client)


def test_a_cordoned_node_gets_no_new_session_until_uncordoned(
    etcd: EtcdServer, daemons: dict[str, Daemon]
) -> None:
    done = loopd("cordon", "a", "--cluster", etcd.url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"node": "a", "cordoned": True}
    with ClusterClient(etcd.url, timeout=20) as cluster:
        for n in range(3):
            cluster.create(f"c{n}")
    assert placed(etcd) == {"c0": "b", "c1": "b", "c2": "b"}
    # Asked directly, the cordoned node refuses in one line and places nothing.
    with pytest.raises(ControlError) as caught:
        call(str(daemons["a"].home), "create", timeout=20, session="direct")
    assert caught.value.code == "cordoned"
    assert "node a is cordoned" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert "direct" not in placed(etcd)
    done = loopd("uncordon", "a", "--cluster", etcd.url)
    assert done.returncode == 0, done.stderr
    with ClusterClient(etcd.url, timeout=20) as cluster:
        cluster.create("after")
    assert placed(etcd)["after"] == "a"  # the least loaded again


def test_a_session_created_right_after_a_drain_does_not_land_on_the_drained_node(
    etcd: EtcdServer, daemons: dict[str, Daemon]
) -> None:
    with ClusterClient(etcd.url, timeout=20) as cluster:
        cluster.create("s0")
        cluster.create("s1")
        assert set(placed(etcd).values()) == {"a", "b"}
        done = loopd("drain", "a", "--cluster", etcd.url)
        assert done.returncode == 0, done.stderr
        assert set(placed(etcd).values()) == {"b"}
        cluster.create("new")  # a has the fewest sessions now, but is drained
        assert placed(etcd)["new"] == "b"
        reply = cluster.send("new", "hello", key="k")
        assert reply["text"] == "echo: hello"
    rows = loopd("status", "--cluster", etcd.url)
    assert rows.returncode == 0, rows.stderr
    header = rows.stdout.splitlines()[0].split()
    assert header[:2] == ["session", "node"]
