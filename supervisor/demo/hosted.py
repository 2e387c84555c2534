"""The demo's main part: a real supervisor hosting sessions under traffic and SIGKILLs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Final

import click
import psutil

from supervisor.client.control import call
from supervisor.client.direct import Client
from supervisor.client.status_table import status_lines
from supervisor.control_socket import SOCKET_NAME
from supervisor.demo.checks import DemoChecks
from supervisor.errors import ControlError
from worker.store.disk.layout import session_dir
from worker.store.format.records import Record, User
from worker.store.loader import load_session

SESSIONS: Final = ("alpha", "bravo", "charlie", "delta")
REQUESTS: Final = 12
DEADLINE: Final = 20.0


def _wait(condition: str, check: Callable[[], object], timeout: float = DEADLINE) -> bool:
    """Poll ``check`` until it returns true or the deadline passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    click.echo(f"  (gave up waiting for {condition})")
    return False


def _status(home: str) -> list[dict[str, object]]:
    rows = call(home, "status")
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _row(home: str, session: str) -> dict[str, object]:
    return next(r for r in _status(home) if r["session"] == session)


def _traffic(
    home: str, session: str, acknowledged: dict[str, list[str]], failures: list[str]
) -> None:
    # Straight to the worker: the daemon only hands over the connection, and after a
    # SIGKILL the client reconnects and sends what was unanswered again, by key.
    with Client(home, retry_for=DEADLINE) as client:
        for n in range(REQUESTS):
            key = f"{session}-{n}"
            try:
                client.send(session, f"request {n} for {session}", key=key)
            except ControlError as exc:
                failures.append(f"{key}: {exc}")
                return
            acknowledged[session].append(key)


def _print_table(rows: list[dict[str, object]]) -> None:
    columns = ("session", "state", "pid", "epoch", "records", "restarts", "last_error")
    for line in status_lines(rows, columns, clip=70):
        click.echo("  " + line)


def run_hosted_demo(home: str, checks: DemoChecks) -> None:
    """Start ``loopd serve``, host sessions under traffic, kill workers, tear a log."""
    click.echo(f"\n== a supervisor hosting {len(SESSIONS)} sessions ({home})")
    os.makedirs(home, exist_ok=True)
    log_path = os.path.join(home, "serve.log")
    click.echo(f"  loopd serve --home {home} --budget 120  (its output: {log_path})")
    with open(log_path, "ab") as log:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "supervisor", "serve", "--home", home, "--budget", "120"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    acknowledged: dict[str, list[str]] = {}
    try:
        acknowledged = _drive(home, daemon, checks)
    finally:
        workers = psutil.Process(daemon.pid).children(recursive=True)
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
        try:
            code = daemon.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            daemon.kill()
            code = daemon.wait()
        _gone, alive = psutil.wait_procs(workers, timeout=5)
        for proc in alive:
            proc.kill()
    checks.check(
        "SIGTERM stopped the supervisor with exit 0 and no worker left", code == 0 and not alive
    )
    _check_logs(home, acknowledged, checks)


def _drive(home: str, daemon: subprocess.Popen[bytes], checks: DemoChecks) -> dict[str, list[str]]:
    """Create the sessions, drive traffic, kill workers mid-way; return what was acked."""
    socket_path = os.path.join(home, SOCKET_NAME)
    checks.check(
        "the supervisor listens",
        _wait("the control socket", lambda: daemon.poll() is None and os.path.exists(socket_path)),
    )
    for session in SESSIONS:
        call(home, "create", session=session)
    checks.check("every session is RUNNING", all(r["state"] == "RUNNING" for r in _status(home)))
    acknowledged: dict[str, list[str]] = {s: [] for s in SESSIONS}
    failures: list[str] = []
    threads = [
        threading.Thread(target=_traffic, args=(home, s, acknowledged, failures)) for s in SESSIONS
    ]
    for thread in threads:
        thread.start()
    victims = SESSIONS[:2]
    _wait("traffic", lambda: all(len(acknowledged[v]) >= 3 for v in victims))
    killed = {}
    for victim in victims:
        pid = _row(home, victim)["pid"]
        if isinstance(pid, int):
            click.echo(f"  SIGKILL worker of {victim} (pid {pid}) mid-traffic")
            os.kill(pid, signal.SIGKILL)
            killed[victim] = pid
    for thread in threads:
        thread.join(timeout=DEADLINE * 2)
    checks.check(
        "every request was acknowledged (clients retried with their keys)",
        not failures and all(len(k) == REQUESTS for k in acknowledged.values()),
    )

    def restarted() -> bool:
        by_name = {str(r["session"]): r for r in _status(home)}
        return all(
            by_name[v]["state"] == "RUNNING"
            and by_name[v]["pid"] != pid
            and int(str(by_name[v]["restarts"])) >= 1
            for v, pid in killed.items()
        )

    # The supervisor notices a death and restarts the worker a moment after the kill; the
    # traffic may have finished (retried elsewhere) before that: wait for it, then show.
    checks.check("the killed workers were restarted with new pids", _wait("restarts", restarted))
    _print_table(_status(home))
    # The supervisor learns a worker's epoch from the worker's state reports, which
    # follow its requests by a moment: wait for them rather than read the first table.
    checks.check(
        "some sessions changed epoch under their context budget",
        _wait(
            "a changed epoch",
            lambda: any(isinstance(r["epoch"], int) and r["epoch"] >= 1 for r in _status(home)),
        ),
    )
    _torn_and_repaired(home, checks)
    return acknowledged


def _torn_and_repaired(home: str, checks: DemoChecks) -> None:
    victim = SESSIONS[-1]
    call(home, "stop", session=victim)
    log = _newest_log(home, victim)
    with open(log, "ab") as f:
        f.write(b'{"type":"User","time":"2026-11-29T')  # a write cut short by a crash
    click.echo(f"  tore the last line of {log}; starting {victim} again")
    try:
        call(home, "start", session=victim)
    except ControlError as exc:
        click.echo(f"  start refused: {exc.message[:160]}...")
    row = _row(home, victim)
    error = str(row["last_error"])
    lines = sum(1 for _ in open(log, "rb"))  # noqa: SIM115 - counted and closed at once
    checks.check(
        f"{victim} is FATAL with {log}:{lines}",
        row["state"] == "FATAL" and f"{log}:{lines}: last line has no newline" in error,
    )
    checks.check("its status names the repair command", "loopd repair" in error)
    checks.check("no restart loop on a refused log", row["restarts"] == 0)
    repaired = subprocess.run(
        [sys.executable, "-m", "supervisor", "repair", "--home", home, victim],
        capture_output=True,
        text=True,
        check=False,
    )
    click.echo("  " + repaired.stdout.strip().replace("\n", "\n  "))
    started = call(home, "start", session=victim)
    checks.check(
        "after `loopd repair` the session starts again",
        isinstance(started, dict) and started["state"] == "RUNNING",
    )


def _newest_log(home: str, session: str) -> str:
    directory = session_dir(home, session)
    newest = max(int(n.split(".")[0]) for n in os.listdir(directory) if n.endswith(".jsonl"))
    return os.path.join(directory, f"{newest}.jsonl")


def _check_logs(home: str, acknowledged: dict[str, list[str]], checks: DemoChecks) -> None:
    """Offline, after the supervisor stopped: every acknowledged key is on disk once."""
    exact = bool(acknowledged)
    for session, keys in acknowledged.items():
        seen: list[str] = []

        def collect(records: Sequence[Record], seen: list[str] = seen) -> None:
            seen.extend(r.key for r in records if isinstance(r, User) and r.key)

        load_session(session_dir(home, session), session, on_epoch=collect, history=True)
        exact = exact and sorted(seen) == sorted(keys)
    checks.check("every acknowledged request is in its log exactly once", exact)
    verified = subprocess.run(
        [sys.executable, "-m", "supervisor", "verify", "--home", home],
        capture_output=True,
        text=True,
        check=False,
    )
    click.echo("  " + verified.stdout.strip().replace("\n", "\n  "))
    checks.check("`loopd verify` passes every session", verified.returncode == 0)
