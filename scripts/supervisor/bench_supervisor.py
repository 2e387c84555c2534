"""Benchmark the supervisor: restart latency (vs supervisord), request rate, 200 sessions.

    python -m scripts.supervisor.bench_supervisor [--kills N] [--sessions N] [--quick]
                                                  [--write-docs]

Restart latency is measured from the SIGKILL of a worker holding a 10,000-record
session to the session serving again, for loopd and, in the same run, for supervisord
(installed by this script into a throw-away venv) supervising a reference worker that
does the same start-up work. Every figure is reported beside its reference.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from scripts.harness.benchmarks_doc import write_section
from scripts.harness.machine import machine_line
from supervisor.client import call, call_with_retry
from supervisor.control_socket import SOCKET_NAME
from supervisor.errors import ControlError
from worker import Assistant, Session, ToolResult, Usage, User
from worker.app import DefaultApp
from worker.ipc.wire import Channel
from worker.store.format.records import Record, encode_record

HERE = Path(__file__).resolve().parent
SESSION_RECORDS = 10_000


def _poll(check: Callable[[], object], timeout: float = 60.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.001)
    raise TimeoutError("benchmark condition not reached")


def make_big_session(home: str, name: str = "big") -> None:
    app = DefaultApp()
    batch: list[Record] = []
    call_no = 0
    with Session.create(home, name, app.initial_baseline(name)) as session:
        for n in range((SESSION_RECORDS - 1) // 4):
            call_no += 1
            batch += [
                User(text=f"request {n}", key=f"k{n}"),
                ToolResult(call=call_no, tool="echo", output=f"request {n}", ok=True),
                Assistant(text=f"echo: request {n}"),
                Usage(prompt_tokens=3, completion_tokens=4, context_tokens=7),
            ]
            if len(batch) >= 1000:
                session.append_many(batch)
                batch = []
        session.append_many(batch)


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def start_daemon(home: str, *args: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "supervisor",
            "serve",
            "--home",
            home,
            "--max-restarts",
            "1000",
            "--start-retries",
            "1000",
            *args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _poll(lambda: os.path.exists(os.path.join(home, SOCKET_NAME)) and _pings(home))
    return proc


def _pings(home: str) -> bool:
    try:
        call(home, "ping", timeout=30)
    except ControlError:
        return False
    return True


def stop_daemon(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


def loopd_restart_latency(root: str, kills: int, method: str) -> list[float]:
    home = os.path.join(root, f"loopd-home-{method}")
    make_big_session(home)
    daemon = start_daemon(home, "--stable-after", "0", "--start-method", method)
    latencies = []
    try:
        _poll(lambda: _state(home) == "RUNNING")
        for n in range(kills):
            pid = _pid(home)
            start = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            # A request sent before the death is noticed gets worker_died and goes again.
            call_with_retry(home, "send", session="big", text=f"after kill {n}",
                            key=f"kill-{n}", deadline=time.monotonic() + 60)  # fmt: skip
            latencies.append(time.perf_counter() - start)
    finally:
        stop_daemon(daemon)
    return latencies


def _state(home: str) -> object:
    rows = call(home, "status", session="big")
    assert isinstance(rows, list)
    return rows[0]["state"]


def _pid(home: str) -> int:
    rows = call(home, "status", session="big")
    assert isinstance(rows, list)
    return int(rows[0]["pid"])


def supervisord_restart_latency(root: str, kills: int) -> list[float] | None:
    venv = os.path.join(root, "supervisord-venv")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    installed = subprocess.run(
        [os.path.join(venv, "bin", "pip"), "install", "-q", "supervisor"],
        capture_output=True,
        text=True,
        check=False,
    )
    if installed.returncode != 0:
        print(f"supervisord could not be installed: {installed.stderr[-400:]}")
        return None
    home = os.path.join(root, "supervisord-home")
    make_big_session(home)
    ping = os.path.join(root, "ref.sock")
    conf = os.path.join(root, "supervisord.conf")
    Path(conf).write_text(f"""
[unix_http_server]
file={root}/supervisor.sock
[supervisord]
nodaemon=true
logfile={root}/supervisord.log
pidfile={root}/supervisord.pid
[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface
[program:ref]
command={sys.executable} {HERE / "reference_server.py"} --home {home} --session big --socket {ping}
autorestart=true
startsecs=0
startretries=1000
stopsignal=KILL
""")
    proc = subprocess.Popen(
        [os.path.join(venv, "bin", "supervisord"), "-c", conf],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    latencies = []
    try:
        pid = int(str(_poll(lambda: _ref_pid(ping))))
        for _ in range(kills):
            start = time.perf_counter()
            os.kill(pid, signal.SIGKILL)

            def restarted(old: int = pid) -> int | None:
                new = _ref_pid(ping)
                return new if new is not None and new != old else None

            new = int(str(_poll(restarted)))
            latencies.append(time.perf_counter() - start)
            pid = new
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    return latencies


def _ref_pid(path: str) -> int | None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(path)
            return int(sock.recv(64).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def request_rate(root: str, count: int) -> tuple[float, float]:
    """Requests/s through the daemon on one connection, and a raw write+fdatasync loop."""
    home = os.path.join(root, "rate-home")
    daemon = start_daemon(home, "--budget", "1000000000")
    try:
        call(home, "create", session="rate")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(os.path.join(home, SOCKET_NAME))
        channel = Channel(sock)
        line = encode_record(User(text="x" * 40, key="k" * 8)) * 4  # one request's bytes
        raw_path = os.path.join(root, "raw.log")
        fd = os.open(raw_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        t_loopd = t_raw = 0.0
        done = 0
        for block in range(20):
            start = time.perf_counter()
            for n in range(count // 20):
                channel.send(
                    {
                        "id": n,
                        "op": "send",
                        "session": "rate",
                        "text": "x" * 40,
                        "key": f"b{block}-{n}",
                    }
                )
                reply = channel.recv()
                assert reply is not None, reply
                assert reply["ok"], reply
            t_loopd += time.perf_counter() - start
            start = time.perf_counter()
            for _ in range(count // 20):
                os.write(fd, line)
                os.fdatasync(fd)
            t_raw += time.perf_counter() - start
            done += count // 20
        os.close(fd)
        sock.close()
    finally:
        stop_daemon(daemon)
    return done / t_loopd, done / t_raw


def many_sessions(root: str, sessions: int, idle: float, method: str) -> dict[str, float]:
    home = os.path.join(root, f"many-home-{method}")
    app = DefaultApp()
    for n in range(sessions):
        Session.create(home, f"s{n:03d}", app.initial_baseline(f"s{n:03d}")).close()
    start = time.perf_counter()
    daemon = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "serve", "--home", home, "--start-method", method],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _poll(lambda: os.path.exists(os.path.join(home, SOCKET_NAME)) and _pings(home))

        def all_running() -> bool:
            rows = call(home, "status")
            return (
                isinstance(rows, list)
                and len(rows) == sessions
                and all(r["state"] == "RUNNING" for r in rows)
            )

        _poll(all_running, timeout=300)
        ready = time.perf_counter() - start
        workers = psutil.Process(daemon.pid).children()
        rss = [w.memory_info().rss for w in workers]
        uss = [w.memory_full_info().uss for w in workers]
        me = psutil.Process(daemon.pid)
        before = me.cpu_times()
        time.sleep(idle)  # the measurement itself: the daemon left alone
        after = me.cpu_times()
        idle_cpu = (after.user + after.system) - (before.user + before.system)
    finally:
        stop_daemon(daemon)
    return {
        "ready_s": ready,
        "rss_median": statistics.median(rss),
        "uss_median": statistics.median(uss),
        "idle_cpu_s": idle_cpu,
        "idle_s": idle,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--skip-supervisord", action="store_true")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="loopd-bench-sup-")
    methods = ("fork", "exec")
    try:
        ours = {m: loopd_restart_latency(root, args.kills, m) for m in methods}
        theirs = None if args.skip_supervisord else supervisord_restart_latency(root, args.kills)
        rate, raw = request_rate(root, args.requests)
        many = {m: many_sessions(root, args.sessions, args.idle, m) for m in methods}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lines = [
        "<!-- supervisor-bench:start -->",
        "## Supervisor",
        "",
        f"Command: `python -m scripts.supervisor.bench_supervisor --kills {args.kills} --sessions "
        f"{args.sessions}`  ",
        f"{machine_line()}. `fork` and `exec` are `serve --start-method`.",
        "",
        "| measure | loopd | reference | ratio | goal |",
        "|---|---|---|---|---|",
    ]
    t_med = statistics.median(theirs) * 1000 if theirs else None
    for method in methods:
        med = statistics.median(ours[method]) * 1000
        p95 = _percentile(ours[method], 0.95) * 1000
        if theirs and t_med is not None:
            t_p95 = _percentile(theirs, 0.95) * 1000
            ref = f"supervisord: median {t_med:.0f} ms, p95 {t_p95:.0f} ms"
            ratio = f"{t_med / med:.1f}x faster"
        else:
            ref, ratio = "supervisord not measured", "-"
        lines.append(
            f"| restart latency ({method}), SIGKILL to serving again, {SESSION_RECORDS:,}-record "
            f"session, {len(ours[method])} kills | median {med:.0f} ms, p95 {p95:.0f} ms | "
            f"{ref} | {ratio} | median <= 25 ms |"
        )
    lines.append(
        f"| request round trip client -> supervisor -> worker -> fsync -> reply | "
        f"{rate:.0f}/s | raw write+fdatasync loop: {raw:.0f}/s | {rate / raw:.2f}x | "
        f">= 0.5x |"
    )
    for method in methods:
        found = many[method]
        lines.append(
            f"| {args.sessions} sessions ({method}): time until all RUNNING | "
            f"{found['ready_s']:.2f} s | - | - | - |"
        )
        lines.append(
            f"| {args.sessions} sessions ({method}): median worker RSS (USS: its own pages) | "
            f"{found['rss_median'] / 2**20:.1f} MB ({found['uss_median'] / 2**20:.1f} MB) | "
            f"- | - | <= 15 MB |"
        )
        lines.append(
            f"| supervisor CPU while idle for {found['idle_s']:.0f} s, {args.sessions} "
            f"sessions ({method}) | {found['idle_cpu_s'] * 1000:.0f} ms | - | - | near zero |"
        )
    lines += ["", "<!-- supervisor-bench:end -->"]
    section = "\n".join(lines)
    print(section)
    if args.write_docs:
        write_section("supervisor-bench", section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
