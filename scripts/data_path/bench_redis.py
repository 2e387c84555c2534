"""Benchmark loopd against Redis (appendonly yes, appendfsync always) side by side.

    python -m scripts.data_path.bench_redis [--rounds N] [--requests N] [--clients N]
                                  [--per-client N] [--dir D] [--write-docs]

Redis is what many teams reach for to keep session state durable. This script starts
``redis-server`` itself (Debian's package ``redis-server``: a reference installed by
hand, never a dependency of loopd) on a unix socket in a temporary directory beside
loopd's home, with no TCP port (``--port 0``), no snapshots (``--save ""``),
``appendonly yes`` and ``appendfsync always``: every write is in the AOF and
fdatasync'd before its reply. It speaks RESP over the socket with the standard library.

In interleaved rounds, each measure's order rotated every round, on the same disk:
- one client, one request at a time: loopd's ``Client.send`` to one session of a real
  ``loopd serve``; Redis ``RPUSH`` of the same request (its key and text) to one list;
  Redis ``RPUSH`` of about the bytes a loopd request writes (four records,
  ``bench_data_path.REQUEST_BYTES``); a raw ``os.write`` + ``os.fdatasync`` loop of
  those bytes;
- N client processes: loopd on N sessions, Redis on N keys, N raw loops on N files,
  the same requests each.
Each rate is reported as the median and min-max over rounds, each ratio as the median
and min-max of its per-round ratios; beside them the CPU each side spends per request,
its log writes (one fdatasync each) and the bytes it appends.

Every process started here (redis-server, ``loopd serve`` and its workers, the client
processes) is stopped and the temporary directory removed at the end, on ^C or SIGTERM
too.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import FrameType
from typing import Any

from scripts.data_path.bench_data_path import (
    REQUEST_BYTES,
    _client_worker,
    _parallel,
    _raw_loop,
    _raw_worker,
    _signals_held,
)
from scripts.data_path.redis_report import render
from scripts.data_path.redis_resp import SOCKET, Resp, RespError, start_redis, stop_redis
from scripts.data_path.redis_rounds import Rounds
from scripts.harness.benchmarks_doc import write_section
from scripts.harness.machine import filesystem_of
from scripts.harness.serve import start_serve, stop_serve
from supervisor.client import Client, call
from supervisor.errors import ControlError
from worker.store.disk.layout import session_dir

INSTALL = "redis-server is not on PATH: install it with `apt-get install -y redis-server` (Debian)"
SESSION = "one"
TEXT = "x" * 40  # every request's text, as in scripts/data_path/bench_data_path.py
_SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes with its NUL


@dataclass
class Rig:
    """What every round uses: the two servers, their clients, where the raw loops write."""

    root: str
    home: str
    sessions: list[str]
    client: Client
    conn: Resp
    redis_path: str
    pids: dict[str, Any]

    @property
    def loopd_dir(self) -> str:
        return session_dir(self.home, SESSION)

    @property
    def redis_dir(self) -> str:
        return os.path.dirname(self.redis_path)


def one_round(rig: Rig, rounds: Rounds, r: int, args: argparse.Namespace) -> None:
    """One round of every measure, each list's order rotated by the round's number."""
    count, me = args.requests, os.getpid()
    worker, redis, workers = rig.pids["worker"], rig.pids["redis"], rig.pids["workers"]
    loopd_cpu = {"client": [me], "worker": [worker], "daemon": [rig.pids["daemon"]]}
    redis_cpu = {"client": [me], "server": [redis]}
    single: list[tuple[str, Callable[[], float], dict[str, list[int]], str | None, list[int]]] = [
        ("loopd", partial(_loopd_block, rig.client, f"r{r}", count), loopd_cpu, rig.loopd_dir,
         [worker]),
        ("redis", partial(_redis_block, rig.conn, f"r{r}", count), redis_cpu, rig.redis_dir,
         [redis]),
        ("redis-bytes", partial(_redis_bytes_block, rig.conn, count), redis_cpu, rig.redis_dir,
         [redis]),
        ("raw", partial(_raw_loop, os.path.join(rig.root, "raw.log"), count), {}, None, []),
    ]  # fmt: skip
    for name, block, cpu, disk, writers in single[r % 4 :] + single[: r % 4]:
        rounds.run(name, count, block, cpu, disk, writers)
    each, clients = args.per_client, range(args.clients)
    many: list[tuple[str, Callable[[], float], list[int]]] = [
        ("loopd-n", partial(_parallel, [
            (_client_worker, (rig.home, rig.sessions[n], f"r{r}c{n}", each)) for n in clients
        ]), workers),
        ("redis-n", partial(_parallel, [
            (_redis_worker, (rig.redis_path, rig.sessions[n], f"r{r}c{n}", each))
            for n in clients
        ]), [redis]),
        ("raw-n", partial(_parallel, [
            (_raw_worker, (os.path.join(rig.root, f"raw-{n}.log"), each)) for n in clients
        ]), []),
    ]  # fmt: skip
    for name, block, servers in many[r % 3 :] + many[: r % 3]:
        total = args.clients * each  # and one warm-up request each, before the barrier
        rounds.run(name, total, block, {"server": servers}, None, servers, total + args.clients)


def measure(root: str, binary: str, args: argparse.Namespace) -> tuple[Rounds, dict[str, Any]]:
    """Start loopd and Redis side by side, run every round, stop both; check the counts."""
    home = os.path.join(root, "loopd")
    redis_dir = os.path.join(root, "redis")
    sessions = [f"s{n:02d}" for n in range(args.clients)]
    rounds = Rounds()
    facts: dict[str, Any] = {}
    daemon = start_serve(home)
    redis = None
    try:
        redis, redis_path = start_redis(binary, redis_dir)
        for session in [SESSION, *sessions]:
            call(home, "create", session=session)
        rows = call(home, "status")
        assert isinstance(rows, list)
        pid_of = {str(row["session"]): int(row["pid"]) for row in rows}
        pids: dict[str, Any] = {
            "worker": pid_of[SESSION],
            "daemon": daemon.pid,
            "redis": redis.pid,
            "workers": [pid_of[s] for s in sessions],
        }
        with Client(home) as client, Resp(redis_path) as conn:
            client.send(SESSION, "warm-up", key="warm")
            conn.command("RPUSH", SESSION, f"warm {TEXT}")
            conn.command("RPUSH", "bytes", REQUEST_BYTES)
            rig = Rig(root, home, sessions, client, conn, redis_path, pids)
            for r in range(args.rounds):
                one_round(rig, rounds, r, args)
            facts["lengths"] = [conn.command("LLEN", key) for key in [SESSION, *sessions]]
    finally:
        with _signals_held():
            if redis is not None:
                stop_redis(redis)
            stop_serve(daemon)
    expected = [1 + args.rounds * args.requests] + [
        args.rounds * (1 + args.per_client)
    ] * args.clients
    if facts["lengths"] != expected:
        raise RuntimeError(f"Redis lists hold {facts['lengths']}, not {expected}")
    return rounds, facts


def _loopd_block(client: Client, tag: str, count: int) -> float:
    start = time.perf_counter()
    for n in range(count):
        client.send(SESSION, TEXT, key=f"{tag}-{n}")
    return time.perf_counter() - start


def _redis_block(conn: Resp, tag: str, count: int) -> float:
    start = time.perf_counter()
    for n in range(count):
        conn.command("RPUSH", SESSION, f"{tag}-{n} {TEXT}")
    return time.perf_counter() - start


def _redis_bytes_block(conn: Resp, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        conn.command("RPUSH", "bytes", REQUEST_BYTES)
    return time.perf_counter() - start


def _redis_worker(path: str, key: str, tag: str, count: int, barrier: Any, out: Any) -> None:
    with Resp(path) as conn:
        conn.command("RPUSH", key, f"{tag}-warm {TEXT}")
        barrier.wait()
        start = time.perf_counter()
        for n in range(count):
            conn.command("RPUSH", key, f"{tag}-{n} {TEXT}")
        out.put(time.perf_counter() - start)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def _interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM: the same clean-up as ^C


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=_positive, default=7)
    parser.add_argument("--requests", type=_positive, default=200, help="one client, a round")
    parser.add_argument("--clients", type=_positive, default=16)
    parser.add_argument("--per-client", type=_positive, default=40, help="each client, a round")
    parser.add_argument("--dir", default=None, help="where both write (default: a temp dir)")
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    if args.dir is not None and not os.path.isdir(args.dir):
        parser.error(f"argument --dir: {args.dir!r} is not a directory")
    if len(os.path.join(args.dir or tempfile.gettempdir(), "loopd-bench-redis-12345678",
                        "redis", SOCKET)) > _SOCKET_PATH_MAX:  # fmt: skip
        parser.error(f"argument --dir: {args.dir!r} is too long for a unix socket path in it")
    binary = shutil.which("redis-server")
    if binary is None:
        print(INSTALL, file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupted)
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    facts: dict[str, Any] = {"load_before": os.getloadavg()[0]}
    root = tempfile.mkdtemp(prefix="loopd-bench-redis-", dir=args.dir)
    try:
        try:
            facts["fs"] = filesystem_of(root)
            rounds, found = measure(root, binary, args)
        finally:
            with _signals_held():
                shutil.rmtree(root, ignore_errors=True)
    except KeyboardInterrupt:
        print("interrupted; every process stopped, nothing left behind", file=sys.stderr)
        return 130
    except (RuntimeError, ControlError, RespError, OSError) as exc:
        print(f"bench_redis: {exc}; every process stopped, nothing left behind", file=sys.stderr)
        return 1
    facts.update(found)
    facts["load_after"] = os.getloadavg()[0]
    facts["version"] = " ".join(version.stdout.split()[:3])
    defaults = parser.parse_args([])
    options = [
        f"--{name.replace('_', '-')} {value}"
        for name, value in vars(args).items()
        if name != "write_docs" and value != getattr(defaults, name)
    ]
    facts["command"] = " ".join(["python -m scripts.data_path.bench_redis", *options])
    section = render(rounds, facts, args)
    print(section)
    if args.write_docs:
        write_section("redis-bench", section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
