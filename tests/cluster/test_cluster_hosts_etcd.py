"""Across hosts, behind ``-m cluster_hosts``: etcd as a user runs it, interrupted moves.

Three etcd members, TLS with client certificates (six hosts): each etcd member
is a host of its own serving clients over https with ``--client-cert-auth``; the nodes
and the client name all three (``--cluster https://e0,https://e1,https://e2``) and
present their certificates to etcd.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from supervisor.cluster.transport import Role
from tests.harness.netns_cluster import (
    run_client,
    session_keys,
    start_etcd,
    start_etcd_members,
    start_node,
)
from tests.harness.netns_hosts import Hosts
from tests.harness.tls_certs import Certificates

TAR = shutil.which("tar") or "/usr/bin/tar"
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


def test_a_move_between_hosts_interrupted_is_finished_or_aborted_by_a_rerun(
    tmp_path: Path,
) -> None:
    """A mover stopped before the copy: a rerun finishes the move. Another stopped before
    the ownership change: ``move --abort`` gives the session back to its source."""
    certs = Certificates(tmp_path / "ca")
    with Hosts(tmp_path / "hosts") as hosts:
        etcd_host, a, b, operator = (hosts.add(n) for n in ("etcd", "a", "b", "operator"))
        url = start_etcd(etcd_host)
        node_a = start_node(a, "a", url, certs)
        node_b = start_node(b, "b", url, certs)
        cluster = ["--cluster", url]
        done = run_client(operator, certs, url, ["a", "b"], [
            {"create": "m1"}, {"create": "m2"}, {"send": "m1", "key": "k1"},
            {"send": "m2", "key": "k2"},
            {"interrupt": "m1", "to": "b", "before": "copy"},
            {"send": "m1", "key": "k-sealed"},  # sealed: refused, not acknowledged
            {"loopd": ["move", "m1", "--to", "b", *cluster]},
            {"send": "m1", "key": "k3"},
            {"interrupt": "m2", "to": "a", "before": "own"},
            {"loopd": ["move", "m2", "--abort", *cluster]},
            {"send": "m2", "key": "k4"},
            {"loopd": ["status", *cluster, "--json"]},
        ], role=Role.OPERATOR)  # fmt: skip
        assert all("ok" in step for step in done[:4]), done
        assert done[4] == {"ok": {"stopped_before": "copy"}}, done[4]
        assert "error" in done[5]
        assert done[6]["code"] == 0, done[6]
        assert "ok" in done[7], done[7]
        assert done[8] == {"ok": {"stopped_before": "own"}}, done[8]
        assert done[9]["code"] == 0, done[9]
        assert "ok" in done[10], done[10]
        m1_b = session_keys(b, node_b, "m1")
        m1_a = session_keys(a, node_a, "m1")
        m2_a = session_keys(a, node_a, "m2")
        m2_b = session_keys(b, node_b, "m2")
    rows = {row["session"]: row["node"] for row in json.loads(done[11]["stdout"])}
    assert rows == {"m1": "b", "m2": "b"}  # m1 moved from a; m2's move to a undone
    assert m1_b["keys"] == ["k1", "k3"]
    assert not m1_a["exists"]
    assert m2_b["keys"] == ["k2", "k4"]
    assert not m2_a["exists"]  # the target's copy, never served, was discarded


def test_a_dead_hosts_session_is_taken_over_from_a_backup_made_on_it(tmp_path: Path) -> None:
    """Lossy by design: what the dead node acknowledged after the backup is gone."""
    certs = Certificates(tmp_path / "ca")
    with Hosts(tmp_path / "hosts") as hosts:
        etcd_host, a, b, operator = (hosts.add(n) for n in ("etcd", "a", "b", "operator"))
        url = start_etcd(etcd_host)
        node_a = start_node(a, "a", url, certs)
        node_b = start_node(b, "b", url, certs)
        cluster = ["--cluster", url]
        done = run_client(operator, certs, url, ["a", "b"], [
            {"create": "t"}, {"send": "t", "key": "k1"}, {"send": "t", "key": "k2"},
        ], role=Role.OPERATOR)  # fmt: skip
        assert all("ok" in step for step in done), done
        backup = tmp_path / "backup"
        archive = a.output_inside(node_a, [TAR, "-C", str(a.private / "home" / "sessions"),
                                           "-cf", "-", "t"])  # fmt: skip
        backup.mkdir()
        subprocess.run([TAR, "-C", str(backup), "-xf", "-"], input=archive, check=True)
        lost = run_client(  # the operator's session: a client certificate is a tenant's
            operator, certs, url, ["a"], [{"send": "t", "key": "k-lost"}], role=Role.OPERATOR
        )
        assert "ok" in lost[0], lost
        a.kill_all()  # the host dies: its daemon and its workers, SIGKILL
        copy = operator.private / "backup" / "t"
        done = run_client(operator, certs, url, ["b"], [
            {"wait_unowned": "t"},
            {"loopd": ["takeover", "t", "--from-copy", str(copy), "--to", "b", *cluster]},
            {"send": "t", "key": "k3"},
            {"loopd": ["status", *cluster, "--json"]},
        ], role=Role.OPERATOR, extra=backup)  # fmt: skip
        assert done[0] == {"ok": "unowned"}, done
        assert done[1]["code"] == 0, done[1]
        assert json.loads(done[1]["stdout"])["node"] == "b"
        assert "ok" in done[2], done[2]
        assert done[2]["ok"]["token"] > lost[0]["ok"]["token"]
        rows = json.loads(done[3]["stdout"])
        assert [(row["session"], row["node"]) for row in rows] == [("t", "b")]
        on_b = session_keys(b, node_b, "t")
    assert on_b["keys"] == ["k1", "k2", "k3"]  # k-lost was acknowledged after the backup
