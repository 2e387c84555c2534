"""The demo's hosting part: hibernation and wake-up, ``loopd logs`` and ``loopd metrics``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Final

import click

from supervisor.client.control import call
from supervisor.client.direct import Client
from supervisor.client.status_table import status_lines
from supervisor.control_socket import SOCKET_NAME
from supervisor.demo.checks import DemoChecks

SESSIONS: Final = ("echo", "foxtrot", "golf")
DEADLINE: Final = 15.0


def _states(home: str) -> dict[str, str]:
    rows = call(home, "status")
    found = {}
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict):
            found[str(row["session"])] = str(row["state"])
    return found


def _until(check: object, timeout: float = DEADLINE) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(check) and check():
            return True
        time.sleep(0.02)
    return False


def _loopd(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return done.stdout


def run_hosting_demo(home: str, checks: DemoChecks) -> None:
    """Sessions that rest without a process until used; their logs and the metrics."""
    click.echo(f"\n== hibernation, logs and metrics ({home})")
    os.makedirs(home, exist_ok=True)
    argv = ["serve", "--home", home, "--idle-stop", "1", "--max-live", "2"]
    click.echo(f"  loopd {' '.join(argv)}")
    with open(os.path.join(home, "serve.log"), "ab") as log:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "supervisor", *argv],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _until(lambda: os.path.exists(os.path.join(home, SOCKET_NAME)))
        for session in SESSIONS:
            call(home, "create", session=session)
        live = sum(state == "RUNNING" for state in _states(home).values())
        checks.check("--max-live 2: the third session made the least recent one rest", live <= 2)
        checks.check(
            "after 1 s without a request every session is IDLE (no process, no descriptor)",
            _until(lambda: set(_states(home).values()) == {"IDLE"}),
        )
        rows = call(home, "status")
        for line in status_lines(
            rows if isinstance(rows, list) else [], ("session", "state", "pid", "records")
        ):
            click.echo("  " + line)
        with Client(home) as client:
            started = time.perf_counter()
            reply = client.send(SESSIONS[0], "wake up", key="wake")
            cold = time.perf_counter() - started
            started = time.perf_counter()
            client.send(SESSIONS[0], "again", key="again")
            warm = time.perf_counter() - started
        click.echo(
            f"  first request to the resting {SESSIONS[0]}: {cold * 1000:.1f} ms "
            f"(its worker started on demand); the next: {warm * 1000:.1f} ms"
        )
        checks.check("a request to an IDLE session wakes it and is answered",
                     reply.get("text") == "echo: wake up")  # fmt: skip
        click.echo(f"  loopd logs --home {home} {SESSIONS[0]} -n 4")
        logs = _loopd("logs", "--home", home, SESSIONS[0], "-n", "4")
        for line in logs.splitlines():
            click.echo("    " + line)
        checks.check("`loopd logs` shows the worker's starts and exits, timestamped",
                     "[loopd] worker" in logs)  # fmt: skip
        click.echo(f"  loopd metrics --home {home}  (some of it)")
        metrics = _loopd("metrics", "--home", home)
        shown = [line for line in metrics.splitlines() if line.startswith((
            "loopd_hibernations_total", "loopd_wakeups_total", "loopd_requests_total",
            "loopd_live_workers", 'loopd_sessions{state="IDLE"}',
        ))]  # fmt: skip
        for line in shown:
            click.echo("    " + line)
        values = {line.split()[0]: float(line.split()[1]) for line in shown}
        checks.check("`loopd metrics` counts the hibernations and the wake-up",
                     values.get("loopd_hibernations_total", 0) >= 3
                     and values.get("loopd_wakeups_total", 0) >= 1)  # fmt: skip
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
        try:
            code = daemon.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            daemon.kill()
            code = daemon.wait()
    checks.check("the supervisor stopped with exit 0", code == 0)
