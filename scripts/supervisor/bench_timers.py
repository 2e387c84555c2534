"""Scheduled requests under faults: each delivered once, none early, and how late.

    python -m scripts.supervisor.bench_timers [--sessions 100] [--per-session 10] [--kills 20]
                                   [--write-docs]

One supervisor with hibernation (``--idle-stop 1``) hosts N sessions; M requests are
scheduled in each (``Client.schedule``, due 10-30 s after each is made, so most are
delivered to hibernated sessions that are woken for them). While they come due, a
running worker is SIGKILLed every second or so, and halfway through the supervisor and
every worker are SIGKILLed at once and the supervisor started again. Then the logs are
read: for every schedule, how many ``User`` records carry its key (1 is right), whether
the first is earlier than the schedule's ``at`` (early), and how late it is. The
reference, in the same run: the round trip of one ordinary request to a hibernated
session (a wake-up), the floor of a delivery's lateness.

The supervisor is restarted as systemd restarts a unit (``KillMode=mixed``, as in the
unit ``loopd systemd-unit`` writes): once every process of the old one is gone. Like
systemd, the benchmark is the reaper of what it kills (``PR_SET_CHILD_SUBREAPER``): the
workers orphaned by the supervisor's SIGKILL become its children and are reaped as soon
as they die. Without it they went to the machine's init, which on the machine of
docs/benchmarks.md reaped them 1.2-1.9 s after their death, in batches: time counted as
the daemon's downtime. ``of_which_reaping_s`` is the part of ``supervisor_down_s``
before the restart began.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

import psutil

from scripts.harness.benchmarks_doc import write_section
from supervisor.client import call
from supervisor.client.direct import Client
from supervisor.control_socket import SOCKET_NAME
from supervisor.errors import ControlError
from supervisor.templates.prctl import become_subreaper
from worker.store.schedules import parse_time

REPO: Final = Path(__file__).resolve().parents[2]
SECTION: Final = "## Scheduled requests under kills and a supervisor restart (issue 33)"


def _start(home: str) -> subprocess.Popen[bytes]:
    log = open(os.path.join(os.path.dirname(home), "serve.log"), "ab")  # noqa: SIM115 - the daemon's
    daemon = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "serve", "--home", home, "--idle-stop", "1",
         "--max-restarts", "100000", "--stable-after", "0"],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    log.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise RuntimeError(f"loopd serve exited with {daemon.returncode}")
        if os.path.exists(os.path.join(home, SOCKET_NAME)):
            try:
                call(home, "ping", timeout=5)
            except ControlError:
                time.sleep(0.05)
                continue
            return daemon
        time.sleep(0.05)
    raise TimeoutError("loopd serve did not listen within 60 s")


def _kill_all(daemon: subprocess.Popen[bytes]) -> None:
    """SIGKILL the supervisor and everything it started, at once; reap them."""
    procs = [psutil.Process(daemon.pid), *psutil.Process(daemon.pid).children(recursive=True)]
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    daemon.wait(30)
    psutil.wait_procs(procs, timeout=30)


def _stop(daemon: subprocess.Popen[bytes]) -> None:
    procs = psutil.Process(daemon.pid).children(recursive=True)
    daemon.send_signal(signal.SIGTERM)
    try:
        daemon.wait(60)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait()
    _gone, alive = psutil.wait_procs(procs, timeout=30)
    for proc in alive:
        proc.kill()


def _rows(home: str) -> list[dict[str, object]]:
    found = call(home, "status", timeout=30)
    return [r for r in found if isinstance(r, dict)] if isinstance(found, list) else []


def _kill_a_worker(home: str, rng: random.Random, daemon_pid: int) -> bool:
    """SIGKILL one RUNNING worker, checked by psutil to descend from the daemon first."""
    try:
        rows = _rows(home)
    except ControlError:
        return False
    running = [r for r in rows if r.get("state") == "RUNNING"]
    if not running:
        return False
    pid = rng.choice(running)["pid"]
    if not isinstance(pid, int):
        return False
    try:
        proc = psutil.Process(pid)
        if daemon_pid not in (parent.pid for parent in proc.parents()):
            return False
        proc.kill()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False
    return True


def _users(home: str, session: str) -> dict[str, list[float]]:
    """The times of the User records of each key, in every epoch's log."""
    found: dict[str, list[float]] = {}
    directory = os.path.join(home, "sessions", session)
    for name in os.listdir(directory):
        if re.fullmatch(r"\d+\.jsonl", name):
            with open(os.path.join(directory, name), "rb") as log:
                for line in log:
                    record = json.loads(line)
                    if record["type"] == "User" and record["key"] is not None:
                        found.setdefault(record["key"], []).append(parse_time(record["time"]) or 0)
    return found


def _wake_round_trips(home: str, sessions: list[str]) -> list[float]:
    """The reference: one request to each of ``sessions`` once it is hibernated."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        idle = {r["session"] for r in _rows(home) if r.get("state") == "IDLE"}
        if set(sessions) <= idle:
            break
        time.sleep(0.2)
    took = []
    with Client(home, timeout=60, retry_for=60) as client:
        for session in sessions:
            started = time.monotonic()
            client.send(session, "wake", key=f"wake-{session}")
            took.append(time.monotonic() - started)
    return took


def measure(
    root: str,
    *,
    sessions: int,
    per_session: int,
    kills: int,
    seed: int = 33,
    ahead: tuple[float, float] = (10.0, 30.0),
    restart: bool = True,
) -> dict[str, object]:
    """Run the benchmark in ``root``; the figures."""
    rng = random.Random(seed)
    home = os.path.join(root, "home")
    os.makedirs(home)
    become_subreaper()  # as systemd: the killed supervisor's workers are ours to reap
    try:
        return _measure(home, rng, sessions, per_session, kills, ahead, restart)
    finally:
        become_subreaper(on=False)


def _measure(
    home: str,
    rng: random.Random,
    sessions: int,
    per_session: int,
    kills: int,
    ahead: tuple[float, float],
    restart: bool,
) -> dict[str, object]:
    names = [f"t{n:03d}" for n in range(sessions)]
    daemon = _start(home)
    due: dict[tuple[str, str], float] = {}
    try:
        with Client(home, timeout=60, retry_for=60) as client:
            for name in names:
                client.call("create", session=name)
            reference = _wake_round_trips(home, names[: min(20, sessions)])
            started = time.time()
            for n in range(per_session):
                for name in names:
                    at = time.time() + rng.uniform(*ahead)
                    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at))
                    iso += f".{int(at % 1 * 1e6):06d}+00:00"
                    answer = client.schedule(name, iso, f"scheduled {n}", key=f"s{n}")
                    due[(name, f"s{n}")] = parse_time(str(answer["at"])) or 0.0
        scheduling_s = time.time() - started
        last = max(due.values())
        restart_at = started + scheduling_s + (last - started - scheduling_s) / 2
        killed = 0
        interval = max(0.2, (last - time.time()) / max(1, kills))
        restarted = not restart
        down = (0.0, 0.0)  # when the supervisor was down (killed, until it listened again)
        reaped = 0.0  # when every killed process was gone (then the restart began)
        while time.time() < last + 1:
            if not restarted and time.time() >= restart_at:
                down = (time.time(), 0.0)
                _kill_all(daemon)
                reaped = time.time()
                daemon = _start(home)
                down = (down[0], time.time())
                restarted = True
            elif killed < kills and _kill_a_worker(home, rng, daemon.pid):
                killed += 1
            time.sleep(interval)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            seen = {name: _users(home, name) for name in names}
            if all(key in seen[name] for name, key in due):
                break
            time.sleep(0.5)
    finally:
        _stop(daemon)
    seen = {name: _users(home, name) for name in names}
    once = early = missing = twice = 0
    lateness: list[float] = []
    lateness_up: list[float] = []  # of the schedules not due while the supervisor was down
    for (name, key), at in due.items():
        times = seen[name].get(key, [])
        if not times:
            missing += 1
            continue
        once += len(times) == 1
        twice += len(times) > 1
        early += times[0] < at
        lateness.append(max(0.0, times[0] - at))
        if not down[0] <= at <= down[1]:
            lateness_up.append(lateness[-1])

    def pct(q: float, values: list[float] = lateness) -> float:
        ordered = sorted(values)
        if not ordered:
            return 0.0
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    wake_p50 = statistics.median(reference)
    return {
        "sessions": sessions, "schedules": len(due), "worker_kills": killed,
        "supervisor_restarts": int(restart), "delivered_once": once,
        "delivered_twice_or_more": twice,
        "missing": missing, "early": early, "lateness_p50_s": pct(0.5),
        "lateness_p99_s": pct(0.99), "lateness_max_s": pct(1.0),
        "supervisor_down_s": round(down[1] - down[0], 3),
        "of_which_reaping_s": round(max(0.0, reaped - down[0]), 3),
        "due_while_down": len(lateness) - len(lateness_up),
        "lateness_p99_not_due_while_down_s": pct(0.99, lateness_up),
        "scheduling_s": round(scheduling_s, 1), "wake_round_trip_p50_s": round(wake_p50, 3),
        "p99_over_wake": round(pct(0.99) / wake_p50, 1) if wake_p50 else None,
    }  # fmt: skip


def _section(figures: dict[str, object], command: str) -> str:
    return (
        f"<!-- timers-bench:start -->\n{SECTION}\n\n`{command}` (the goal: 1,000 schedules "
        "across 100 sessions, workers SIGKILLed and the supervisor restarted during the run, "
        "each delivered exactly once, none early, p99 lateness <= 1 s). Lateness is the first "
        "`User` record's time minus the schedule's `at`; the reference is one ordinary "
        "request to a hibernated session (a wake-up), measured in the same run.\n\n"
        "| figure | value |\n|---|---|\n"
        + "".join(f"| {name} | {value} |\n" for name, value in figures.items())
        + "\n<!-- timers-bench:end -->"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--per-session", type=int, default=10)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument(
        "--ahead",
        type=float,
        nargs=2,
        default=(10.0, 30.0),
        metavar=("MIN", "MAX"),
        help="seconds from scheduling to due time",
    )
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loopd-timers-") as root:
        figures = measure(
            root,
            sessions=args.sessions,
            per_session=args.per_session,
            kills=args.kills,
            ahead=tuple(args.ahead),
        )
    print(json.dumps(figures))
    if args.write_docs:
        command = (
            f"python -m scripts.supervisor.bench_timers --sessions {args.sessions} "
            f"--per-session {args.per_session} --kills {args.kills}"
        )
        write_section("timers-bench", _section(figures, command))


if __name__ == "__main__":
    main()
