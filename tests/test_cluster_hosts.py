"""A cluster across hosts: etcd, two nodes and a client, each in a namespace of its own.

Nothing connects the hosts but the bridge (``tests/netns_hosts.py``): each node's home
is a tmpfs of its own mount namespace, reached by the client only over mutual TLS at the
``tls://`` address the node registered in etcd.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.netns_cluster import node_address, run_client, start_etcd, start_node
from tests.netns_hosts import Hosts
from tests.tls_certs import Certificates

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
        done = run_client(
            client,
            certs,
            url,
            ["a", "b"],
            [
                ["create", *cluster, "s1"],
                ["send", *cluster, "s1", "hello", "--key", "k1"],
                ["status", *cluster, "--json"],
            ],
            sessions=["s2", "s3", "s4"],
        )
        for result in done["commands"]:
            assert result["code"] == 0, result
        assert json.loads(done["commands"][1]["stdout"])["duplicate"] is False
        for session in ("s2", "s3", "s4"):
            first, again = done["api"][session]
            assert (first["duplicate"], again["duplicate"]) == (False, True), done["api"]
            assert first["token"] == again["token"]
        rows = {row["session"]: row for row in json.loads(done["commands"][2]["stdout"])}
        assert set(rows) == {"s1", "s2", "s3", "s4"}
        assert {row["node"] for row in rows.values()} == {"a", "b"}
        assert all(row["state"] == "RUNNING" for row in rows.values())
        # The homes are private: the test's own view of a's home directory is empty.
        assert list(a.private.iterdir()) == []
        log = (a.root / "serve.log").read_text() + (b.root / "serve.log").read_text()
        assert "tls: refused" not in log
        assert node_address(a) != node_address(b)
