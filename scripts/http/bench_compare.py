"""HTTP sends of several source trees' serves at once, alternated request by request.

    python -m scripts.http.bench_compare [--rounds N] [--requests N] TREE [TREE ...]

Each TREE is a loopd source tree (``.`` for this one; another commit's from
``git archive COMMIT | tar -x -C DIR``): one ``loopd serve --http`` is started from
each, on a temporary home, with one session. One client then sends to all of them in
turn, request by request, the order rotated: a keyed send by the minimal HTTP client
of ``bench_http`` and a ``Client.send``, on each tree's serve. A burst of the machine's
other load falls on every tree alike, where runs one after the other differ by more
than the change measured. Per tree: the ratio of the HTTP send to ``Client.send`` (the
median of the rounds' ratios, each round's figure its median request) and the serve
process's CPU per HTTP send (its own counters over the counted rounds; a
``Client.send`` costs serve nothing).

Every process started here is stopped and the temporary directory removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from scripts.harness.serve import start_serve, stop_serve
from scripts.http.bench_http import APP, _connection, _create, _free_port
from scripts.http.minimal_client import minimal_send
from supervisor.client import Client

RECONNECT_EVERY = 500
"""Requests on one HTTP connection before a new one (serve ends one after 1,000)."""


@dataclass
class Side:
    """One tree's serve, its clients and its figures."""

    tree: str
    port: int
    serve: psutil.Process
    client: Client
    raw: socket.socket
    sent: int = 0
    http: list[float] = field(default_factory=list)  # a round's median, µs
    direct: list[float] = field(default_factory=list)
    cpu_s: float = 0.0

    def send_http(self, key: str) -> None:
        self.sent += 1
        if self.sent % RECONNECT_EVERY == 0:
            self.raw.close()
            self.raw = _socket_of(self.port)
        minimal_send(self.raw, "rt", key)

    def send_direct(self, key: str) -> None:
        self.client.send("rt", "hello there", key=key)

    def cpu(self) -> float:
        times = self.serve.cpu_times()
        return float(times.user + times.system)


def _socket_of(port: int) -> socket.socket:
    raw = _connection(port).sock
    assert raw is not None
    return raw


def compare(sides: list[Side], rounds: int, count: int) -> None:
    """Fill each side's figures: ``rounds`` counted rounds after one that warms up."""
    jobs: list[tuple[Side, str, Callable[[str], None]]] = []
    for side in sides:
        jobs += [(side, "http", side.send_http), (side, "direct", side.send_direct)]
    for r in range(rounds + 1):
        taken: dict[tuple[int, str], list[float]] = {}
        before = [side.cpu() for side in sides]
        for i in range(count):
            for side, kind, send in jobs[i % len(jobs) :] + jobs[: i % len(jobs)]:
                start = time.perf_counter()
                send(f"{kind}-{r}-{i}")
                taken.setdefault((id(side), kind), []).append(time.perf_counter() - start)
        if not r:
            continue
        for side, cpu_before in zip(sides, before, strict=True):
            side.cpu_s += side.cpu() - cpu_before
            side.http.append(statistics.median(taken[(id(side), "http")]) * 1e6)
            side.direct.append(statistics.median(taken[(id(side), "direct")]) * 1e6)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", help="loopd source trees ('.' for this one)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="loopd-bench-compare-")
    procs = []
    sides: list[Side] = []
    try:
        for index, tree in enumerate(args.trees):
            home, port = os.path.join(root, f"home{index}"), _free_port()
            proc = start_serve(home, "--http", f"127.0.0.1:{port}", "--app", APP, tree=tree)
            procs.append(proc)
            _create(port, "rt")
            sides.append(Side(tree, port, psutil.Process(proc.pid), Client(home), _socket_of(port)))
        compare(sides, args.rounds, args.requests)
    finally:
        for side in sides:
            side.client.close()
            side.raw.close()
        for proc in procs:
            stop_serve(proc)
        shutil.rmtree(root, ignore_errors=True)
    print("| tree | HTTP send | `Client.send` | ratio, over rounds | serve CPU per HTTP send |")
    print("|---|---|---|---|---|")
    for side in sides:
        ratios = [h / d for h, d in zip(side.http, side.direct, strict=True)]
        print(
            f"| {side.tree} | {statistics.median(side.http):.0f} µs | "
            f"{statistics.median(side.direct):.0f} µs | {statistics.median(ratios):.2f}x, "
            f"{min(ratios):.2f}-{max(ratios):.2f} | "
            f"{side.cpu_s / (args.rounds * args.requests) * 1e6:.0f} µs |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
