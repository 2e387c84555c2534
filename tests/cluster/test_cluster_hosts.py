"""A cluster across hosts: etcd, two nodes and a client, each in a namespace of its own.

Nothing connects the hosts but the bridge (``tests/harness/netns_hosts.py``): each node's home
is a tmpfs of its own mount namespace, reached by the client only over mutual TLS at the
``tls://`` address the node registered in etcd.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from supervisor.cluster.transport import Role
from tests.harness.netns_cluster import (
    node_address,
    run_client,
    session_keys,
    start_etcd,
    start_node,
)
from tests.harness.netns_hosts import Hosts
from tests.harness.tls_certs import Certificates

pytestmark = pytest.mark.timeout(110)


def test_a_client_on_another_host_creates_sends_and_sees_each_sessions_node(
    tmp_path: Path,
) -> None:
    certs = Certificates(tmp_path / "ca")
    with Hosts(tmp_path / "hosts") as hosts:
        etcd_host = hosts.add("etcd")
        a, b = hosts.add("a"), hosts.add("b")
        client = hosts.add("client")
        url = start_etcd(etcd_host)
        start_node(a, "a", url, certs)
        start_node(b, "b", url, certs)
        cluster = ["--cluster", url]
        sessions = ["s2", "s3", "s4"]
        api: list[dict[str, object]] = []
        for s in sessions:
            api += [{"create": s}, {"send": s, "key": f"{s}-k"}, {"send": s, "key": f"{s}-k"}]
        done = run_client(client, certs, url, ["a", "b"], [
            {"loopd": ["create", *cluster, "s1"]},
            {"loopd": ["send", *cluster, "s1", "hello", "--key", "k1"]},
            *api,
            {"loopd": ["status", *cluster, "--json"]},
        ])  # fmt: skip
        commands = [done[0], done[1], done[-1]]
        for result in commands:
            assert result["code"] == 0, result
        assert json.loads(done[1]["stdout"])["duplicate"] is False
        for n in range(len(sessions)):
            _created, first, again = done[2 + 3 * n : 5 + 3 * n]
            assert (first["ok"]["duplicate"], again["ok"]["duplicate"]) == (False, True), done
            assert first["ok"]["token"] == again["ok"]["token"]
        rows = {row["session"]: row for row in json.loads(done[-1]["stdout"])}
        assert set(rows) == {"s1", "s2", "s3", "s4"}
        assert {row["node"] for row in rows.values()} == {"a", "b"}
        assert all(row["state"] == "RUNNING" for row in rows.values())
        # The homes are private: the test's own view of a's home directory is empty.
        assert list(a.private.iterdir()) == []
        log = (a.root / "serve.log").read_text() + (b.root / "serve.log").read_text()
        assert "tls: refused" not in log
        assert node_address(a) != node_address(b)


def test_a_session_moves_between_hosts_that_share_nothing(tmp_path: Path) -> None:
    """The target pulls the sealed copy over TLS; every acknowledged key is on it once."""
    certs = Certificates(tmp_path / "ca")
    with Hosts(tmp_path / "hosts") as hosts:
        etcd_host, a, b, operator = (hosts.add(n) for n in ("etcd", "a", "b", "operator"))
        url = start_etcd(etcd_host)
        node_a = start_node(a, "a", url, certs)
        node_b = start_node(b, "b", url, certs)
        cluster = ["--cluster", url]
        before: list[dict[str, object]] = [{"send": "m", "key": f"k{n}"} for n in range(8)]
        after: list[dict[str, object]] = [
            {"send": "m", "key": f"k{n}"} for n in range(6, 12)
        ]  # 6, 7 again
        done = run_client(operator, certs, url, ["a", "b"], [
            {"create": "m"}, *before,
            {"loopd": ["move", "m", "--to", "b", *cluster]},
            *after,
            {"loopd": ["move", "m", "--to", "b", *cluster]},  # a rerun: already there
            {"loopd": ["status", *cluster, "--json"]},
        ], role=Role.OPERATOR)  # fmt: skip
        assert all("error" not in step for step in done), done
        moved = done[1 + len(before)]
        assert moved["code"] == 0, moved
        assert json.loads(moved["stdout"])["node"] == "b"
        replies = [step["ok"] for step in done if "ok" in step][1:]
        tokens = [reply["token"] for reply in replies]
        assert tokens == sorted(tokens)  # the new owner answers with a higher token
        assert tokens[-1] > tokens[0]
        assert [r["duplicate"] for r in replies[len(before) :]] == [True, True] + [False] * 4
        assert done[-2]["code"] == 0, done[-2]
        rows = json.loads(done[-1]["stdout"])
        assert [(row["session"], row["node"]) for row in rows] == [("m", "b")]
        on_b = session_keys(b, node_b, "m")
        on_a = session_keys(a, node_a, "m")
    assert on_b["exists"]
    assert on_b["keys"] == [f"k{n}" for n in range(12)]  # each acknowledged key once
    assert on_b["token"] == tokens[-1]
    assert not on_a["exists"]  # released by the source
