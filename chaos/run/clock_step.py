"""A step of the system clock under a real ``loopd serve``: its stopped workers are still
killed as hung.

Serve runs in a mount namespace of its own whose ``/proc/stat`` is a file the run writes
(chaos/run/mutant_serve.py, --proc-stat), so the run steps the clock for serve alone. Sessions are
created; once each runs, the clock is stepped (the boot time moved by ``STEP`` seconds)
and every session's worker is SIGSTOPped, every thread of it seen stopped. Each
violation names its invariant (``invariant: what``):

``stopped-worker-killed``: within ``KILL_WITHIN`` seconds of its SIGSTOP (a hang timeout
of ``HANG_TIMEOUT`` seconds, and a machine at a load of 10) each session runs again on a
worker other than the one stopped. Serve tells a worker from a later process of the same
pid by its start since boot; told apart by a wall-clock time, every worker looks like
another process after the step, and serve signals none of them.

Needs root (a mount namespace): without it the run says so as a failure.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Final

from chaos.lifeline import die_with_parent
from chaos.proc_states import all_stopped
from chaos.run.catch_up import kill_tree, poll
from chaos.run.mutant_serve import step_clock
from chaos.run.supervised import SupervisedReport, serve_stderr, stop_serve, wait_listening
from supervisor.client import call

RUN: Final = "clock-step"
KILLED: Final = "stopped-worker-killed"
HANG_TIMEOUT: Final = 1.0
STEP: Final = 7
"""Seconds the clock is stepped forward by (a whole number: ``btime`` is in seconds)."""
KILL_WITHIN: Final = 20.0
"""Seconds a stopped worker may live: its hang timeout, the daemon's tick and slack, and
the restart, on a machine at a load of 10."""


def run_clock_step(
    home: str, *, sessions: int = 3, timeout: float = 60.0, mutant: str | None = None
) -> SupervisedReport:
    """Create ``sessions``, step the clock, SIGSTOP their workers, check each is killed."""
    report = SupervisedReport(sessions=sessions)
    if os.geteuid() != 0:
        report.failures.append("the clock-step run needs root (a mount namespace for serve)")
        return report
    start = time.monotonic()
    deadline = start + timeout
    stat = os.path.abspath(home) + ".stat"
    os.makedirs(os.path.dirname(stat), exist_ok=True)
    shutil.copyfile("/proc/stat", stat)
    names = [f"clock-{n}" for n in range(sessions)]
    daemon = _serve(home, stat, mutant)
    stopped: list[int] = []
    try:
        try:
            wait_listening(home, daemon, deadline)
        except RuntimeError as exc:  # no mount namespace here (a container without the right)
            report.failures.append(f"serve in a mount namespace of its own: {exc}")
            return report
        for name in names:
            call(home, "create", session=name)
        first = poll(
            functools.partial(_workers, home, names), deadline, "every session to run", RUN
        )
        step_clock(stat, STEP)
        for pid in first.values():
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        poll(lambda: all(map(all_stopped, stopped)), deadline, "the workers to stop", RUN)
        report.kills = len(stopped)
        killed_by = time.monotonic() + KILL_WITHIN
        while time.monotonic() < killed_by and not _all_replaced(home, first):
            time.sleep(0.05)  # polled against ``killed_by``: the invariant's own bound
        now = _workers(home, names, running_only=False) or {}
        for name, pid in first.items():
            if now.get(name) == pid:
                report.violate(KILLED, f"{name}: worker {pid}, SIGSTOPped after a clock "
                               f"step of {STEP} s, still runs it {KILL_WITHIN:g} s later "
                               f"(--hang-timeout {HANG_TIMEOUT:g})")  # fmt: skip
            else:
                report.restarts += 1
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # never left stopped for serve's stop
        if report.violations:
            kill_tree(daemon)  # it cannot signal its workers: its stop would wait for them
        elif daemon.poll() is None:
            stop_serve(daemon)
    report.elapsed = time.monotonic() - start
    return report


def _serve(home: str, stat: str, mutant: str | None) -> subprocess.Popen[bytes]:
    stderr = os.open(serve_stderr(home), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "chaos.run.mutant_serve", "--proc-stat", stat,
             mutant or "-", "serve", "--home", home, "--hang-timeout", f"{HANG_TIMEOUT:g}",
             "--backoff-base", "0.01"],
            stdout=subprocess.DEVNULL, stderr=stderr,
            preexec_fn=functools.partial(die_with_parent, os.getpid()),  # noqa: PLW1509 - no thread yet
        )  # fmt: skip
    finally:
        os.close(stderr)  # serve holds its own copy


def _workers(home: str, names: list[str], *, running_only: bool = True) -> dict[str, int] | None:
    """Each session's worker pid (None until each has one, RUNNING if ``running_only``)."""
    rows = call(home, "status")
    pids = {}
    if isinstance(rows, list):
        for row in rows:
            ok = isinstance(row, dict) and isinstance(row.get("pid"), int)
            if ok and (not running_only or row.get("state") == "RUNNING"):
                pids[str(row["session"])] = int(row["pid"])
    return pids if set(names) <= set(pids) else None


def _all_replaced(home: str, first: dict[str, int]) -> bool:
    now = _workers(home, list(first))
    return now is not None and all(now[name] != pid for name, pid in first.items())
