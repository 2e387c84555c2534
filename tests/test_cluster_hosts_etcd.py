"""etcd as a user runs it, across hosts: three members, TLS with client certificates.

Behind ``-m cluster_hosts`` (six hosts, a minute of a loaded machine): each etcd member
is a host of its own serving clients over https with ``--client-cert-auth``; the nodes
and the client name all three (``--cluster https://e0,https://e1,https://e2``) and
present their certificates to etcd.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.cluster.transport import Role
from tests.netns_cluster import run_client, start_etcd_members, start_node
from tests.netns_hosts import Hosts
from tests.tls_certs import Certificates

pytestmark = [pytest.mark.cluster_hosts, pytest.mark.timeout(115)]


def test_the_cluster_goes_on_when_the_etcd_member_it_used_is_killed(tmp_path: Path) -> None:
    certs = Certificates(tmp_path / "ca")
    with Hosts(tmp_path / "hosts") as hosts:
        members = [hosts.add(f"e{n}") for n in range(3)]
        a, b, client = hosts.add("a"), hosts.add("b"), hosts.add("client")
        url = start_etcd_members(members, certs)
        assert url.count("https://") == 3
        start_node(a, "a", url, certs)
        start_node(b, "b", url, certs)
        first = run_client(client, certs, url, ["a", "b"], [
            {"create": "s1"}, {"create": "s2"},
            {"send": "s1", "key": "k1"}, {"send": "s2", "key": "k2"},
        ])  # fmt: skip
        assert all("ok" in step for step in first), first
        members[0].processes[0].kill()  # the endpoint every client tries first
        members[0].processes[0].wait()
        then = run_client(client, certs, url, ["a", "b"], [
            {"send": "s1", "key": "k3"}, {"send": "s2", "key": "k4"}, {"create": "s3"},
            {"send": "s3", "key": "k5"},
            {"loopd": ["status", "--cluster", url, "--json"]},
        ], role=Role.OPERATOR)  # fmt: skip
        assert all("error" not in step for step in then), then
        assert then[-1]["code"] == 0, then[-1]
        # The same tokens: neither node lost its lease (its keepalive went to e1).
        assert then[0]["ok"]["token"] == first[2]["ok"]["token"]
        assert then[1]["ok"]["token"] == first[3]["ok"]["token"]
        logs = (a.root / "serve.log").read_text() + (b.root / "serve.log").read_text()
        assert "expired in etcd" not in logs
