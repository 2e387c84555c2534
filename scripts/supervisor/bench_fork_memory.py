"""What each forkserver practice gives a forked worker's private memory (USS), side by side.

    python -m scripts.supervisor.bench_fork_memory [--workers N] [--sessions N] [--write-docs]

One process imports everything the daemon imports and holds about as many objects as a
supervisor that knows ``--sessions`` sessions; it then forks ``--workers`` workers
(``worker.process.main`` on 100-record sessions, as serve's fork start method runs it),
each variant in turn, has each serve one request, and reports the median USS (the pages
a worker alone holds) once they are all idle. The parent allocates between forks, as a
live supervisor does. Variants:

- ``fork``: the child freezes the gc at once (what spawn.py does);
- ``gc.freeze() in the parent``: frozen before each fork as well (unfrozen after);
- ``quiet template``: forked from a template process that does nothing between forks
  (a forkserver), not from the busy parent;
- ``warm-up``: the worker's code run once in the parent first (worker/warm_up.py, what
  serve now does before its first fork).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import psutil

import supervisor.daemon.loop  # noqa: F401 - everything the daemon imports
from scripts.harness.benchmarks_doc import write_section
from scripts.harness.machine import machine_line
from worker import Assistant, Session, ToolResult, Usage, User
from worker.app import DefaultApp
from worker.ipc.wire import encode
from worker.process import main
from worker.store.format.records import Record
from worker.warm_up import warm_up


def build(home: str, count: int) -> list[str]:
    app = DefaultApp()
    names = [f"s{n:04d}" for n in range(count)]
    for name in names:
        with Session.create(home, name, app.initial_baseline(name)) as session:
            batch: list[Record] = []
            for i in range(24):
                batch += [
                    User(text=f"request {i}", key=f"k{i}"),
                    ToolResult(call=i + 1, tool="echo", output=f"request {i}", ok=True),
                    Assistant(text=f"echo: request {i}"),
                    Usage(prompt_tokens=3, completion_tokens=4, context_tokens=7),
                ]
            session.append_many(batch)
    return names


def _worker(home: str, name: str, channel: socket.socket) -> None:
    """In the child: become the worker, as spawn.py's fork path does."""
    gc.freeze()
    keep = channel.fileno()
    os.closerange(3, keep)  # the other workers' channels, as spawn.py closes them
    os.closerange(keep + 1, 1 << 16)
    code = main(["--home", home, "--session", name, "--channel-fd", str(channel.fileno())])
    os._exit(code)


def _fork(
    home: str, name: str, before: Callable[[], None] = lambda: None
) -> tuple[int, socket.socket]:
    ours, theirs = socket.socketpair()
    before()
    pid = os.fork()
    if pid == 0:
        ours.close()
        _worker(home, name, theirs)
    gc.unfreeze()
    theirs.close()
    ours.recv(4096)  # its ready message
    # One request through its control channel (the daemon's relay path), then idle.
    request = {"text": "hello", "key": f"bench-{time.monotonic_ns()}"}
    ours.sendall(encode({"id": 1, "op": "request", "request": request}))
    ours.recv(1 << 16)
    return pid, ours


def _uss_then_stop(workers: list[tuple[int, socket.socket]]) -> float:
    time.sleep(0.5)
    uss = statistics.median(psutil.Process(pid).memory_full_info().uss for pid, _ in workers)
    for pid, sock in workers:
        sock.close()  # its control channel's end: a clean stop
        os.waitpid(pid, 0)
    return uss


def direct(home: str, names: list[str], churn: list[object], freeze: int) -> float:
    workers = []
    for name in names:
        workers.append(_fork(home, name, gc.freeze if freeze else lambda: None))
        churn.append([object() for _ in range(2000)])  # the parent goes on allocating
    return _uss_then_stop(workers)


def template(home: str, names: list[str], churn: list[object]) -> float:
    """Workers forked by a quiet child of the parent; the parent churns meanwhile."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        gc.freeze()
        workers = []
        for name in names:
            theirs.recv(16)
            workers.append(_fork(home, name))
            theirs.send(b"ok")
        theirs.send(str(_uss_then_stop(workers)).encode())
        os._exit(0)
    theirs.close()
    for _ in names:
        ours.send(b"go")
        ours.recv(16)
        churn.append([object() for _ in range(2000)])
    uss = float(ours.recv(64))
    os.waitpid(pid, 0)
    return uss


def main_() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=30)
    parser.add_argument("--sessions", type=int, default=10_000, help="sessions the parent knows")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="loopd-bench-fork-")
    # About what a supervisor holds per known session (its HostedSession and spec).
    known = [{"id": f"s{n:05d}", "state": "IDLE", "env": {}, "n": list(range(16))}
             for n in range(args.sessions)]  # fmt: skip
    churn: list[object] = []
    results: dict[str, list[float]] = {}
    try:
        names = build(root, args.workers)
        variants: list[tuple[str, Callable[[], float]]] = [
            ("fork (the child freezes the gc)", lambda: direct(root, names, churn, 0)),
            (
                "gc.freeze() in the parent before each fork",
                lambda: direct(root, names, churn, True),
            ),
            ("forked by a quiet template (a forkserver)", lambda: template(root, names, churn)),
        ]
        for _ in range(args.rounds):
            for label, run in variants:
                results.setdefault(label, []).append(run())
        warm_up()  # from here on the parent has run the worker's code once
        label = "fork after warm_up() in the parent (serve's fork start method)"
        results[label] = [direct(root, names, churn, 0) for _ in range(args.rounds)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    del known
    base = statistics.median(results["fork (the child freezes the gc)"])
    lines = [
        "<!-- fork-memory-bench:start -->",
        "### What each forkserver practice gives",
        "",
        f"Command: `python -m scripts.supervisor.bench_fork_memory --workers {args.workers} "
        f"--sessions {args.sessions} --rounds {args.rounds}`  ",
        f"{machine_line()}; load average {os.getloadavg()[0]:.1f} at the end. "
        f"{args.workers} workers of 100-record sessions a variant, each after one request, "
        f"forked from one process holding objects for {args.sessions:,} sessions.",
        "",
        "| variant | median USS of a worker | against `fork` |",
        "|---|---|---|",
    ]
    for label, values in results.items():
        uss = statistics.median(values)
        lines.append(f"| {label} | {uss / 2**20:.2f} MiB | {uss / base:.2f}x |")
    lines += ["", "<!-- fork-memory-bench:end -->"]
    section = "\n".join(lines)
    print(section)
    if args.write_docs:
        write_section("fork-memory-bench", section)
    return 0


if __name__ == "__main__":
    sys.exit(main_())
