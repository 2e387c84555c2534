"""Density benchmark: 10,000 sessions known to one supervisor, at most 500 live.

    python -m scripts.supervisor.bench_density [--sessions N] [--max-live N] [--home DIR] [--keep]

Builds a home of N sessions (100 records each; ``--big`` of them with 10,000 records),
starts ``loopd serve --idle-stop 600 --max-live M`` with a real ``NOTIFY_SOCKET`` and
reports, side by side:

- the time from ``serve`` to ``READY=1`` over the N session directories;
- the supervisor's RSS with N sessions known and none live;
- the first request to a cold (hibernated) session, 100 and 10,000 records, against the
  same request to a live session through a new connection (p50, p99);
- with M sessions made live: the supervisor's RSS, the total PSS of supervisor and
  workers, and the number of live workers after touching more than M sessions.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import psutil

from supervisor.client import Client
from worker import Assistant, Session, ToolResult, Usage, User
from worker.app import DefaultApp
from worker.store.format.records import Record


def build_home(home: str, sessions: int, big: int) -> None:
    app = DefaultApp()
    for n in range(sessions):
        name = f"s{n:05d}"
        records = 10_000 if n < big else 100
        with Session.create(home, name, app.initial_baseline(name)) as session:
            batch: list[Record] = []
            for i in range((records - 1) // 4):
                batch += [
                    User(text=f"request {i}", key=f"k{i}"),
                    ToolResult(call=i + 1, tool="echo", output=f"request {i}", ok=True),
                    Assistant(text=f"echo: request {i}"),
                    Usage(prompt_tokens=3, completion_tokens=4, context_tokens=7),
                ]
                if len(batch) >= 2000:
                    session.append_many(batch)
                    batch = []
            if batch:
                session.append_many(batch)
        if n % 1000 == 999:
            print(f"  built {n + 1} sessions", file=sys.stderr)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def first_request(home: str, session: str) -> float:
    with Client(home) as client:
        return timed(lambda: client.send(session, "hello", key=f"bench-{time.time_ns()}"))


def total_pss(root: psutil.Process) -> tuple[int, int]:
    """(PSS of the supervisor and all its workers, number of workers)."""
    total = 0
    children = root.children(recursive=True)
    for proc in [root, *children]:
        try:
            total += proc.memory_full_info().pss
        except psutil.NoSuchProcess:
            continue
    return total, len(children)


def run(args: argparse.Namespace) -> list[tuple[str, str]]:
    home = args.home or tempfile.mkdtemp(prefix="loopd-density-")
    if not os.path.isdir(os.path.join(home, "sessions")):
        started = time.perf_counter()
        build_home(home, args.sessions, args.big)
        print(f"  home built in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    notify_path = os.path.join(tempfile.mkdtemp(prefix="loopd-notify-"), "notify.sock")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    notify.settimeout(300)
    env = {**os.environ, "NOTIFY_SOCKET": notify_path}
    argv = [sys.executable, "-m", "supervisor", "serve", "--home", home,
            "--idle-stop", "600", "--max-live", str(args.max_live)]  # fmt: skip
    started = time.perf_counter()
    daemon = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
    rows: list[tuple[str, str]] = []
    try:
        while b"READY=1" not in notify.recv(4096):
            pass
        ready = time.perf_counter() - started
        me = psutil.Process(daemon.pid)
        rows.append(
            (f"serve to READY=1 over {args.sessions} session directories", f"{ready:.2f} s")
        )
        rows.append(
            ("supervisor RSS, all sessions hibernated", f"{me.memory_info().rss / 2**20:.1f} MiB")
        )
        small = [f"s{n:05d}" for n in range(args.big, args.big + args.samples)]
        big = [f"s{n:05d}" for n in range(min(args.big, args.samples))]
        for label, names in (("100-record", small), ("10,000-record", big)):
            cold = [first_request(home, name) for name in names]
            warm = [first_request(home, name) for name in names]
            rows.append(
                (
                    f"first request, cold {label} session (p50 / p99, {len(names)} sessions)",
                    f"{percentile(cold, 0.5) * 1000:.1f} / {percentile(cold, 0.99) * 1000:.1f} ms",
                )
            )
            rows.append(
                (
                    f"same request, live {label} session, new connection (p50 / p99)",
                    f"{percentile(warm, 0.5) * 1000:.1f} / {percentile(warm, 0.99) * 1000:.1f} ms",
                )
            )
        touch = [f"s{n:05d}" for n in range(args.max_live + 100)]
        with Client(home) as client:
            for name in touch:
                client.send(name, "hello", key=f"fill-{name}")
        time.sleep(1.0)  # the last stops past the cap are reaped
        pss, workers = total_pss(me)
        rows.append(
            (
                f"live workers after touching {len(touch)} sessions (--max-live {args.max_live})",
                str(workers),
            )
        )
        rows.append(
            ("supervisor RSS with the live workers", f"{me.memory_info().rss / 2**20:.1f} MiB")
        )
        rows.append(
            (
                "total PSS, supervisor + live workers",
                f"{pss / 2**20:.0f} MiB ({pss / max(workers, 1) / 2**20:.2f} MiB a worker)",
            )
        )
        rows.append(
            ("machine", f"{os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB")
        )
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=120)
        notify.close()
        shutil.rmtree(os.path.dirname(notify_path), ignore_errors=True)
        if not args.keep and not args.home:
            shutil.rmtree(home, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--big", type=int, default=100, help="sessions with 10,000 records")
    parser.add_argument("--max-live", type=int, default=500)
    parser.add_argument("--samples", type=int, default=100, help="sessions timed per kind")
    parser.add_argument("--home", default=None, help="reuse (or build once into) this home")
    parser.add_argument("--keep", action="store_true", help="keep the built home")
    args = parser.parse_args()
    rows = run(args)
    print("| measure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
