"""What ``loopd chaos cluster`` found, each reduced to a test of its own.

A session moved away from a node and back again stayed STOPPED once that node restarted:
the move's source ``stop`` was kept as an operator's stop in the node's intent file, the
cluster ``forget`` after the release did not clear it, and the node restarted honoured
it (the cluster ``forget`` clears the entry now). Found by ``loopd chaos cluster --seed
20261201 --duration 300 --etcd-members 3`` (s3 answered "session s3 is STOPPED" for the
last 167 s of the load).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from supervisor.cluster.transport import Role
from tests.harness.netns_cluster import run_client, start_etcd, start_node
from tests.harness.netns_hosts import Hosts
from tests.harness.tls_certs import Certificates

pytestmark = pytest.mark.timeout(115)


def test_a_session_moved_away_and_back_is_served_after_its_node_restarts(
    tmp_path: Path,
) -> None:
    certs = Certificates(tmp_path / "ca")
    with Hosts(tmp_path / "hosts") as hosts:
        etcd_host, operator = hosts.add("etcd"), hosts.add("operator")
        a, b = hosts.add("a", disk=True), hosts.add("b", disk=True)
        url = start_etcd(etcd_host)
        node_a = start_node(a, "a", url, certs)
        start_node(b, "b", url, certs)
        cluster = ["--cluster", url]
        done = run_client(operator, certs, url, ["a", "b"], [
            {"create": "m"}, {"send": "m", "key": "k1"},
            {"loopd": ["move", "m", "--to", "b", *cluster]},
            {"loopd": ["move", "m", "--to", "a", *cluster]},
            {"send": "m", "key": "k2"},
        ], role=Role.OPERATOR)  # fmt: skip
        assert [step.get("code", 0) for step in done] == [0] * 5, done
        assert "ok" in done[-1], done
        assert a.disk is not None
        intent = json.loads((a.disk / "home" / "intent.json").read_text())
        node_a.terminate()  # an operator's restart of a's loopd serve
        node_a.wait(timeout=60)
        start_node(a, "a", url, certs)
        # The operator's certificate again: a client certificate is a tenant of its own,
        # and m, created by the operator, is not its session.
        then = run_client(operator, certs, url, ["a", "b"], [{"send": "m", "key": "k3"}],
                          role=Role.OPERATOR)  # fmt: skip
    assert "ok" in then[0], f"{then[0]} (a's intent file said {intent})"
