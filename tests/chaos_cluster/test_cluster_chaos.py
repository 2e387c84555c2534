"""``loopd chaos cluster`` run as a user runs it: a slice by default, the long run behind
``-m cluster_chaos``; the checker shown to catch faults put into a real run's history.

Needs root, iproute2, openssl and etcd: without them a test skips with the reason, and
fails under ``CI=true`` (as the other namespace tests do).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from chaos.cluster.checker import check
from chaos.cluster.history import History, LogEntry
from chaos.cluster.netns_hosts import IP
from tests.harness.etcd_server import etcd_binary
from tests.harness.netns_hosts import require_namespaces
from tests.harness.postgres_server import postgres_bin
from tests.harness.support import REPO, poll_until

SLICE_SEED = 1133
"""Its six faults: pause-node, move, partition-node-etcd, partition-client-node,
kill-host, netem (chaos.cluster.faults.pick, from the seed alone)."""
SLICE_KINDS = ["pause-node", "move", "partition-node-etcd", "partition-client-node",
               "kill-host", "netem"]  # fmt: skip


def require_rig() -> None:
    require_namespaces()
    etcd_binary()
    if shutil.which("openssl") is None or shutil.which("tc") is None:
        why = "loopd chaos cluster needs openssl and tc (iproute2) on PATH"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)


def chaos_cluster(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """The command run to its end; afterwards none of its namespaces is left."""
    process = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "chaos", "cluster", *args],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert namespaces_of(process.pid) == set(), "namespaces left behind"
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def namespaces_of(pid: int) -> set[str]:
    """The namespaces made by the run of process ``pid`` (chaos.cluster.netns_hosts names them
    ``ld<pid>x<n>...``; other runs on the machine have theirs)."""
    listed = subprocess.run([IP, "netns", "list"], check=True, capture_output=True, text=True)
    names = {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}
    return {name for name in names if name.startswith(f"ld{pid % 100000}x")}


def held(report: dict[str, Any]) -> dict[str, bool]:
    return {name: verdict["held"] for name, verdict in report["invariants"].items()}


def caught(history: History) -> set[str]:
    return {name for name, found in check(history).items() if found}


@pytest.mark.timeout(300)
def test_a_slice_of_the_cluster_chaos_run_holds_and_its_history_catches_planted_faults(
    tmp_path: Path,
) -> None:
    require_rig()
    out = tmp_path / "report.json"
    done = chaos_cluster("--seed", str(SLICE_SEED), "--steps", "6", "--json-report", str(out),
                         timeout=280)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"seed: {SLICE_SEED}  (replay: loopd chaos cluster --seed {SLICE_SEED} --steps 6" in (
        done.stdout
    )
    report = json.loads(out.read_text())
    assert held(report) == dict.fromkeys(held(report), True)
    assert len(held(report)) == 5
    assert [f["kind"] for f in report["history"]["faults"]] == SLICE_KINDS
    assert [f["error"] for f in report["history"]["faults"]] == [None] * 6, report["notes"]
    assert report["outcomes"]["ack"] > 50

    history = History.from_json(report["history"])
    assert caught(history) == set()
    acked = [r for r in history.requests if r.outcome == "ack"]
    assert len({r.token for r in acked}) > 1  # the faults changed owners' tokens
    # A key acknowledged by the cluster, written twice on its final owner's log.
    first = acked[0]
    node = history.placement[first.session]
    assert node is not None
    final = (node, first.session)
    log = history.logs[final]
    doubled = replace(history, logs={**history.logs, final: replace(
        log, entries=[*log.entries, LogEntry("user", key=first.key)])})  # fmt: skip
    assert "acknowledged-once" in caught(doubled)
    # ... or lost from it.
    lost = replace(history, logs={**history.logs, final: replace(
        log, entries=[e for e in log.entries if e.key != first.key])})  # fmt: skip
    assert "acknowledged-once" in caught(lost)
    # A client accepting, after its highest token of a session, a reply with a lower one
    # (of a session whose owner the faults changed: not every session's owner is hit).
    planted = []
    for process, session in sorted({(r.process, r.session) for r in acked}):
        top = max((r for r in acked if (r.process, r.session) == (process, session)),
                  key=lambda r: r.end)  # fmt: skip
        low = min(r.token for r in acked if r.session == session and r.token is not None)
        if top.token is not None and low < top.token:
            planted.append(replace(top, key="planted", token=low, end=top.end + 0.001))
    assert planted, "no client saw a session's token grow"
    late = planted[0]
    assert "client-tokens-grow" in caught(replace(history, requests=[*history.requests, late]))
    # A node answering with a token etcd gave another node.
    other = next(r for r in acked if r.node != first.node)
    stolen = replace(other, node=first.node, token=other.token, key="planted2")
    assert "one-owner-at-a-time" in caught(replace(history, requests=[*history.requests, stolen]))
    # A reply from a node while its host was killed (a client making one up).
    kill = next(f for f in history.faults if f["kind"] == "kill-host")
    ghost = replace(first, node=kill["targets"][0], key="planted3",
                    end=(kill["applied"] + kill["healed"]) / 2)  # fmt: skip
    assert "no-reply-from-a-lost-host" in caught(
        replace(history, requests=[*history.requests, ghost])
    )


@pytest.mark.timeout(120)
def test_sigterm_tears_the_run_down(tmp_path: Path) -> None:
    require_rig()
    process = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "chaos", "cluster", "--seed", "5", "--steps",
         "50"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        poll_until(lambda: len(namespaces_of(process.pid)) >= 4, timeout=60, what="the hosts")
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert err.strip().splitlines()[-1] == "loopd chaos cluster: stopped; every host torn down"
    assert namespaces_of(process.pid) == set()


def test_a_missing_prerequisite_is_refused_in_one_line(tmp_path: Path) -> None:
    """A PATH with the namespace tools but no ``tc``: refused, naming it (without root:
    refused naming root)."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("ip", "unshare", "mount", "nsenter", "openssl", "sh"):
        found = shutil.which(tool)
        if found is not None:
            (tools / tool).symlink_to(found)
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "chaos", "cluster", "--steps", "1"],
        cwd=REPO, check=False, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PATH": str(tools)},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    expected = "no 'tc' on PATH" if os.geteuid() == 0 else "network namespaces need root"
    assert lines[0].startswith("loopd chaos cluster: cannot run: ")
    assert expected in lines[0]


@pytest.mark.cluster_chaos
@pytest.mark.timeout(1200)
def test_the_long_cluster_chaos_run_with_three_etcd_members_holds(tmp_path: Path) -> None:
    require_rig()
    out = tmp_path / "report.json"
    done = chaos_cluster("--duration", "300", "--etcd-members", "3", "--json-report", str(out),
                         timeout=1100)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert all(held(report).values()), report["invariants"]
    assert "kill-etcd-member" in report["faults"]


def test_a_report_in_a_missing_directory_is_refused_before_the_run(tmp_path: Path) -> None:
    report = tmp_path / "no-such-dir" / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "chaos", "cluster", "--json-report", str(report)],
        cwd=REPO, check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"python -m supervisor chaos cluster: Invalid value for --json-report: {report}: "
        "no such directory"
    ]


POSTGRES_SEED = 7
"""Its four faults: kill-db-primary, kill-host, pause-node, kill-db-standby."""
POSTGRES_KINDS = ["kill-db-primary", "kill-host", "pause-node", "kill-db-standby"]


def promotions(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f["detail"] for f in report["history"]["faults"] if f["kind"] == "kill-db-primary"]


def standby_losses(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f["detail"] for f in report["history"]["faults"] if f["kind"] == "kill-db-standby"]


@pytest.mark.timeout(400)
def test_a_slice_on_postgres_with_its_primary_killed_holds_and_writes_resume(
    tmp_path: Path,
) -> None:
    """The sessions in a PostgreSQL primary with two quorum standbys, each a host of its
    own; the primary SIGKILLed and the most advanced standby promoted, the other
    re-pointed at it without a restart, and a standby SIGKILLed with writes going on,
    among the node faults."""
    require_rig()
    postgres_bin()
    out = tmp_path / "report.json"
    done = chaos_cluster("--store", "postgres", "--seed", str(POSTGRES_SEED), "--steps", "4",
                         "--faults", ",".join(sorted(POSTGRES_KINDS)), "--json-report",
                         str(out), timeout=380)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--store postgres" in done.stdout.splitlines()[0]  # the replay line says it
    report = json.loads(out.read_text())
    assert all(held(report).values()), report["invariants"]
    assert [f["kind"] for f in report["history"]["faults"]] == POSTGRES_KINDS
    assert [f["error"] for f in report["history"]["faults"]] == [None] * 4, report["notes"]
    (promoted,) = promotions(report)
    assert promoted["resumed_s"] is not None, promoted  # acknowledged again after it
    furthest = max(promoted["positions"].values())
    assert promoted["positions"][promoted["promoted"]] == furthest, promoted
    assert promoted["repointed_by"] == "reload", promoted
    (lost,) = standby_losses(report)
    assert lost["acked_while_down"] > 0, lost  # ANY 1: the other standby confirmed them
    assert report["outcomes"]["ack"] > 50
    # Every session's log was read out of the database, and each verifies.
    logs = report["history"]["logs"]
    assert {log["session"] for log in logs} == {f"s{n}" for n in range(4)}
    assert all(log["verified"] for log in logs)


@pytest.mark.cluster_chaos
@pytest.mark.timeout(1200)
def test_the_long_cluster_chaos_run_on_postgres_holds(tmp_path: Path) -> None:
    require_rig()
    postgres_bin()
    out = tmp_path / "report.json"
    done = chaos_cluster("--store", "postgres", "--duration", "300", "--json-report",
                         str(out), timeout=1100)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert all(held(report).values()), report["invariants"]
    assert {"kill-db-primary", "kill-db-standby"} <= set(report["faults"])
    assert all(d["resumed_s"] is not None for d in promotions(report))
    assert all(d["acked_while_down"] > 0 for d in standby_losses(report))
