"""Benchmark the direct data path against raw write+fdatasync loops on the same disk.

    python -m scripts.data_path.bench_data_path [--requests N] [--clients N] [--kills N]
                                                [--write-docs]

Every figure is a ratio against a reference measured in the same run:
- one client, one session, one request at a time, vs one raw ``os.write`` +
  ``os.fdatasync`` loop writing the same bytes a request appends;
- N client processes on N sessions (keyed requests, one at a time each), vs N raw
  processes each looping on its own file;
- N client processes on ONE session (group commit across clients), vs the same N raw
  processes;
- the same single-client round trip relayed through the daemon (the old path);
- restart latency after SIGKILL of a worker holding a 10,000-record session, measured
  as a client sees it (kill to the next request answered);
- supervisor CPU while idle.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.synchronize import Barrier
from typing import Any

import psutil

from scripts.harness.benchmarks_doc import write_section
from scripts.harness.machine import machine_line
from scripts.harness.serve import start_serve, stop_serve
from scripts.supervisor.bench_supervisor import make_big_session
from supervisor.client import Client, call
from supervisor.control_socket import SOCKET_NAME
from worker import User
from worker.ipc.wire import Channel
from worker.store.format.records import encode_record

REQUEST_BYTES = encode_record(User(text="x" * 40, key="k" * 8)) * 4  # about one request
_FORK = multiprocessing.get_context("fork")
TMPFS = "/dev/shm"  # noqa: S108 - a private mkdtemp inside it, removed afterwards


def _raw_loop(path: str, count: int) -> float:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    start = time.perf_counter()
    for _ in range(count):
        os.write(fd, REQUEST_BYTES)
        os.fdatasync(fd)
    elapsed = time.perf_counter() - start
    os.close(fd)
    return elapsed


def _raw_worker(path: str, count: int, barrier: Barrier, out: Any) -> None:
    barrier.wait()
    out.put(_raw_loop(path, count))


def _client_worker(
    home: str, session: str, tag: str, count: int, barrier: Barrier, out: Any
) -> None:
    with Client(home) as client:
        client.send(session, "warm-up", key=f"{tag}-warm")
        barrier.wait()
        start = time.perf_counter()
        for n in range(count):
            client.send(session, "x" * 40, key=f"{tag}-{n}")
        out.put(time.perf_counter() - start)


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold ^C and SIGTERM (delivered at the end): for forking children or cleaning up."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _child(target: Any, *args: Any) -> None:
    """One of ``_parallel``'s processes: a ^C is the parent's to handle (it kills us)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    target(*args)


def _parallel(targets: list[tuple[Any, tuple[Any, ...]]]) -> float:
    """Run the targets in processes from one barrier; return the slowest one's time."""
    barrier = _FORK.Barrier(len(targets))
    out = _FORK.Queue()
    procs = [_FORK.Process(target=_child, args=(t, *a, barrier, out)) for t, a in targets]
    try:
        with _signals_held():  # no ^C between a fork and the handle that can kill it
            for proc in procs:
                proc.start()
        times = [out.get(timeout=600) for _ in procs]
    except BaseException:  # a failed or interrupted run: no process left behind
        for proc in procs:
            if proc.pid is not None:
                proc.kill()
        raise
    finally:
        for proc in procs:
            if proc.pid is not None:
                proc.join()
    return float(max(times))


def single_round_trip(root: str, count: int) -> dict[str, float]:
    home = os.path.join(root, "single")
    daemon = start_serve(home)
    t_direct = t_relay = t_raw = 0.0
    blocks = 10
    try:
        call(home, "create", session="one")
        import socket  # noqa: PLC0415 - only the relay measure needs a raw connection

        relay = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        relay.connect(os.path.join(home, SOCKET_NAME))
        channel = Channel(relay)
        with Client(home) as client:
            client.send("one", "warm-up", key="warm")
            for block in range(blocks):
                start = time.perf_counter()
                for n in range(count // blocks):
                    client.send("one", "x" * 40, key=f"d{block}-{n}")
                t_direct += time.perf_counter() - start
                t_raw += _raw_loop(os.path.join(root, "raw-single.log"), count // blocks)
                start = time.perf_counter()
                for n in range(count // blocks // 2):
                    channel.send({"id": n, "op": "send", "session": "one", "text": "x" * 40,
                                  "key": f"r{block}-{n}"})  # fmt: skip
                    reply = channel.recv()
                    assert reply is not None
                    assert reply["ok"], reply
                t_relay += time.perf_counter() - start
        relay.close()
    finally:
        stop_serve(daemon)
    done = count // blocks * blocks
    return {
        "direct": done / t_direct,
        "raw": done / t_raw,
        "relay": (count // blocks // 2 * blocks) / t_relay,
    }


def cost_without_the_disk(count: int) -> float | None:
    """Microseconds per Client.send with the home on tmpfs (fsync is free there): what
    loopd itself costs per request, client and worker, IPC included."""
    if not os.path.isdir(TMPFS):
        return None
    root = tempfile.mkdtemp(prefix="loopd-bench-shm-", dir=TMPFS)
    home = os.path.join(root, "home")
    daemon = start_serve(home)
    try:
        call(home, "create", session="one")
        with Client(home) as client:
            client.send("one", "warm-up", key="warm")
            start = time.perf_counter()
            for n in range(count):
                client.send("one", "x" * 40, key=f"t{n}")
            elapsed = time.perf_counter() - start
    finally:
        stop_serve(daemon)
        shutil.rmtree(root, ignore_errors=True)
    return elapsed / count * 1e6


def aggregate(root: str, clients: int, count: int, *, one_session: bool) -> dict[str, float]:
    name = "one" if one_session else "many"
    home = os.path.join(root, f"agg-{name}")
    daemon = start_serve(home)
    try:
        sessions = ["shared"] if one_session else [f"s{n:02d}" for n in range(clients)]
        for session in sessions:
            call(home, "create", session=session)
        slowest = _parallel(
            [
                (_client_worker, (home, sessions[n % len(sessions)], f"c{n}", count))
                for n in range(clients)
            ]
        )
    finally:
        stop_serve(daemon)
    raw_slowest = _parallel(
        [(_raw_worker, (os.path.join(root, f"raw-{name}-{n}.log"), count)) for n in range(clients)]
    )
    return {"loopd": clients * count / slowest, "raw": clients * count / raw_slowest}


def restart_latency(root: str, kills: int) -> list[float]:
    home = os.path.join(root, "restart")
    make_big_session(home)
    daemon = start_serve(home, "--stable-after", "0")
    latencies = []
    try:
        with Client(home) as client:
            client.send("big", "warm-up", key="warm")
            for n in range(kills):
                rows = call(home, "status", session="big")
                assert isinstance(rows, list)
                pid = int(rows[0]["pid"])
                start = time.perf_counter()
                os.kill(pid, signal.SIGKILL)
                client.send("big", f"after kill {n}", key=f"kill-{n}")
                latencies.append(time.perf_counter() - start)
                if rows[0]["pid"] == pid:  # the kill was seen before the send: a restart
                    pass
    finally:
        stop_serve(daemon)
    return latencies


def idle_cpu(root: str, sessions: int, seconds: float) -> float:
    home = os.path.join(root, "idle")
    daemon = start_serve(home)
    try:
        for n in range(sessions):
            call(home, "create", session=f"i{n}")
        me = psutil.Process(daemon.pid)
        before = me.cpu_times()
        time.sleep(seconds)  # the measurement itself: the daemon left alone
        after = me.cpu_times()
    finally:
        stop_serve(daemon)
    return (after.user + after.system) - (before.user + before.system)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--per-client", type=int, default=300)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--idle-sessions", type=int, default=200)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="loopd-bench-data-")
    try:
        single = single_round_trip(root, args.requests)
        bare = cost_without_the_disk(args.requests)
        many = aggregate(root, args.clients, args.per_client, one_session=False)
        shared = aggregate(root, args.clients, args.per_client, one_session=True)
        kills = restart_latency(root, args.kills)
        idle = idle_cpu(root, args.idle_sessions, args.idle)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    n = args.clients
    lines = [
        "<!-- data-path-bench:start -->",
        "## Data path",
        "",
        f"Command: `python -m scripts.data_path.bench_data_path --requests {args.requests} "
        f"--clients {n} --per-client {args.per_client} --kills {args.kills}`  ",
        f"{machine_line()}; every figure beside its reference from the same run.",
        "",
        "| measure | loopd | reference | ratio | goal |",
        "|---|---|---|---|---|",
        f"| round trip, one client, one session, `Client.send` (client -> worker -> fsync -> "
        f"client) | {single['direct']:.0f}/s | raw write+fdatasync loop: {single['raw']:.0f}/s "
        f"| {single['direct'] / single['raw']:.2f}x | >= 0.7x |",
        f"| loopd's own cost per request (client, IPC, worker, store; home on tmpfs, where "
        f"fsync is free) | {bare or 0:.0f} µs | raw loop's fsync on the disk: "
        f"{1e6 / single['raw']:.0f} µs | - | - |",
        f"| the same relayed through the daemon (`call(..., 'send')`, the old path) | "
        f"{single['relay']:.0f}/s | raw loop: {single['raw']:.0f}/s | "
        f"{single['relay'] / single['raw']:.2f}x | - |",
        f"| aggregate, {n} client processes on {n} sessions, keyed, one request at a time "
        f"each | {many['loopd']:.0f}/s | {n} raw processes: {many['raw']:.0f}/s | "
        f"{many['loopd'] / many['raw']:.2f}x | >= 0.8x |",
        f"| aggregate, {n} client processes on ONE session (group commit across clients) | "
        f"{shared['loopd']:.0f}/s | {n} raw processes: {shared['raw']:.0f}/s | "
        f"{shared['loopd'] / shared['raw']:.2f}x | > 1x |",
        f"| restart latency seen by a client, SIGKILL to the next request answered, "
        f"10,000-record session, {len(kills)} kills | median "
        f"{statistics.median(kills) * 1000:.0f} ms, p95 "
        f"{sorted(kills)[int(0.95 * (len(kills) - 1))] * 1000:.0f} ms | the commit before, "
        f"same run: `scripts/supervisor/compare_with_commit.py` | - | unchanged or better |",
        f"| supervisor CPU while idle for {args.idle:.0f} s, {args.idle_sessions} sessions "
        f"(heartbeats in shared memory) | {idle * 1000:.0f} ms | before this change: 0 ms | - "
        f"| 0 |",
        "",
        "<!-- data-path-bench:end -->",
    ]
    section = "\n".join(lines)
    print(section)
    if args.write_docs:
        write_section("data-path-bench", section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
