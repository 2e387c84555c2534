"""``loopd move``, ``loopd drain`` and ``loopd takeover`` as an operator runs them."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.ownership import owner_of
from supervisor.node.drain import placements
from tests.harness.cluster_support import Node, create_session, register, send
from tests.harness.etcd_server import EtcdServer
from tests.harness.support import loopd
from worker import Session
from worker.store.disk.layout import session_dir


@pytest.fixture
def client(etcd: EtcdServer) -> Iterator[EtcdClient]:
    with EtcdClient(etcd.url) as client:
        yield client


@pytest.fixture
def nodes(client: EtcdClient, tmp_path: Path) -> Iterator[list[Node]]:
    registered = [register(client, name, tmp_path / name) for name in ("a", "b", "c")]
    yield registered
    for node in registered:
        node.lease.close()


def test_drain_moves_every_session_of_a_node_evenly_to_the_others(
    client: EtcdClient, nodes: list[Node]
) -> None:
    a, b, c = nodes
    for n in range(4):
        create_session(client, a, f"s{n}")
        send(a.home, f"s{n}", f"key{n}")
    done = loopd("drain", "a", "--cluster", client.url)
    assert done.returncode == 0, done.stderr
    moved = [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted(m["node"] for m in moved) == ["b", "b", "c", "c"]
    assert set(placements(client).values()) == {"b", "c"}
    assert list((a.home / "sessions").iterdir()) == []
    for m in moved:
        owner = owner_of(client, m["session"])
        assert owner is not None
        assert (owner.node, owner.token) == (m["node"], m["token"])
        home = b.home if m["node"] == "b" else c.home
        with Session.open(home, m["session"]) as opened:
            assert opened.find_key(f"key{m['session'][1:]}") is not None


def test_move_to_an_unknown_node_fails_in_one_line_and_changes_nothing(
    client: EtcdClient, nodes: list[Node]
) -> None:
    a = nodes[0]
    token = create_session(client, a, "s")
    done = loopd("move", "s", "--to", "nowhere", "--cluster", client.url)
    assert done.returncode == 1
    assert "node nowhere is not registered" in done.stderr
    owner = owner_of(client, "s")
    assert owner is not None
    assert (owner.node, owner.token) == ("a", token)


def test_takeover_of_a_session_whose_owner_lives_is_refused(
    client: EtcdClient, nodes: list[Node], tmp_path: Path
) -> None:
    a = nodes[0]
    create_session(client, a, "s")
    shutil.copytree(session_dir(a.home, "s"), tmp_path / "copy")
    done = loopd(
        "takeover", "s", "--from-copy", str(tmp_path / "copy"), "--to", "b", "--cluster", client.url
    )
    assert done.returncode == 1
    assert "a owns it" in done.stderr
