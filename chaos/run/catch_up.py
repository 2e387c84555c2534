"""The catch-up of overdue schedules at a restart, against a real ``loopd serve``.

Sessions are created and each schedules one request (``DUE_KEY``) a few seconds ahead,
their due times in the reverse order of their names. Once the daemon's files hold every
schedule (what a restarted daemon reads), serve and every worker are SIGKILLed; once
every schedule has come due, serve starts again with hibernation on (a session rests
IDLE until something wakes it), so that every session is woken by the catch-up alone.
Each violation names its invariant (``invariant: what``):

``overdue-delivered-once``: each schedule's request is in its session's log exactly
once, and no earlier than its time.

``catch-up-earliest-due-first``: the restarted serve woke the overdue sessions earliest
due first: its event stream (stderr) says each start, ``IDLE -> STARTING``, in the
order its loop made them. The workers' pids no longer give that order: serve's spare
worker is forked before the start that takes it. The order in which the workers then
run their deliveries is the scheduler's, and is not judged.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final, TypeVar

import psutil

from chaos.lifeline import die_with_parent
from chaos.run.supervised import SupervisedReport, serve_stderr, stop_serve, wait_listening
from supervisor.client import Client, call
from supervisor.scheduling.files import read_derived
from worker.store.disk.layout import session_dir
from worker.store.errors import SessionError
from worker.store.format.records import Record, User
from worker.store.loader import load_session
from worker.store.schedules import parse_time

DUE_KEY: Final = "due"
AHEAD: Final = 4.0
"""Seconds from the last schedule's making to the first one's time: past the wait for
the daemon's files and the kill, so that each comes due while no supervisor runs (a
second or two on a machine at a load of 10: the sessions are created before it)."""
SPACING: Final = 0.05
"""Seconds between two sessions' due times."""
ORDER: Final = "catch-up-earliest-due-first"
ONCE: Final = "overdue-delivered-once"
_STARTED: Final = re.compile(r"event: \S+ (\S+) IDLE -> STARTING\b")
"""A hibernated session's start, as serve's event stream says it on stderr."""
T = TypeVar("T")


@dataclass(slots=True)
class CatchUpReport(SupervisedReport):
    """What a catch-up run did and found (``acknowledged``: each session's schedule)."""

    due: dict[str, float] = field(default_factory=dict)
    woken: list[str] = field(default_factory=list)
    """The sessions in the order the restarted serve started their workers."""


def run_catch_up(
    home: str, *, sessions: int = 10, timeout: float = 60.0, mutant: str | None = None
) -> CatchUpReport:
    """Schedule, SIGKILL serve, restart it once everything is due, check the catch-up.

    ``mutant``: one of ``chaos.mutants.SERVE_MUTANTS``, patched into both serves.
    ``failures`` say why the run could not judge (a setup slower than ``AHEAD``).
    """
    report = CatchUpReport(sessions=sessions)
    start = time.monotonic()
    deadline = start + timeout
    # Named so that their order is the reverse of their due times: woken in name order,
    # the latest due would come first.
    names = [f"catch-up-{n:02d}" for n in range(sessions)]
    with _serve(home, mutant, deadline) as daemon:
        with Client(home, timeout=max(1.0, deadline - time.monotonic())) as client:
            for name in names:
                client.call("create", session=name)
            first = time.time() + AHEAD
            for rank, name in enumerate(reversed(names)):
                at = _iso(first + rank * SPACING)
                answer = client.schedule(name, at, "overdue", key=DUE_KEY)
                report.due[name] = parse_time(str(answer["at"])) or 0.0
                report.acknowledged[name] = [DUE_KEY]
        poll(lambda: _recorded(home, names) == report.due, deadline, "every schedule recorded")
        kill_tree(daemon)
        report.kills = 1
    early = [name for name in names if _delivered(home, name)]
    if early:
        report.failures.append(f"delivered before serve was killed (a slow setup): {early}")
        return report
    time.sleep(max(0.0, max(report.due.values()) - time.time()))  # the clock's own deadline
    said = os.path.getsize(serve_stderr(home))  # what the first serve wrote: not read
    with _serve(home, mutant, deadline):
        poll(lambda: all(_delivered(home, name) for name in names), deadline, "deliveries")
        poll(functools.partial(_worker_pids, home, names), deadline, "workers")
        woken = poll(functools.partial(_woken, home, said, names), deadline, "its events")
    report.elapsed = time.monotonic() - start
    report.woken = woken
    _check(home, report)
    return report


def _check(home: str, report: CatchUpReport) -> None:
    for name, due in report.due.items():
        times = _delivered(home, name)
        if len(times) != 1:
            report.violate(ONCE, f"{name}: its schedule delivered {len(times)} times")
        elif times[0] < due:
            report.violate(ONCE, f"{name}: delivered {due - times[0]:.3f} s early")
    in_due_order = sorted(report.woken, key=report.due.__getitem__)
    if report.woken != in_due_order:
        first = next(a for a, b in zip(report.woken, in_due_order, strict=True) if a != b)
        report.violate(
            ORDER,
            f"woken {', '.join(report.woken)}; earliest due first is "
            f"{', '.join(in_due_order)} ({first} was woken out of its turn)",
        )


@contextmanager
def _serve(home: str, mutant: str | None, deadline: float) -> Iterator[subprocess.Popen[bytes]]:
    """A real ``loopd serve`` (``mutant`` patched in), hibernating; SIGTERMed and reaped at
    the end of the block unless it was killed in it, its workers after it."""
    serve = ["chaos.run.mutant_serve", mutant] if mutant else ["supervisor"]
    os.makedirs(os.path.dirname(os.path.abspath(home)), exist_ok=True)
    stderr = os.open(serve_stderr(home), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    daemon = subprocess.Popen(
        [sys.executable, "-m", *serve, "serve", "--home", home, "--idle-stop", "600"],
        stdout=subprocess.DEVNULL, stderr=stderr,
        # It dies with the rig (its workers follow: their control channel closes).
        preexec_fn=functools.partial(die_with_parent, os.getpid()),  # noqa: PLW1509 - no thread yet
    )  # fmt: skip
    os.close(stderr)  # serve holds its own copy
    try:
        wait_listening(home, daemon, deadline)
        yield daemon
    except BaseException:
        kill_tree(daemon)
        raise
    if daemon.returncode is None:
        stop_serve(daemon)


def kill_tree(daemon: subprocess.Popen[bytes]) -> None:
    """SIGKILL serve and every process below it (a crash of the whole host's service)."""
    try:
        workers = psutil.Process(daemon.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        workers = []
    daemon.kill()
    daemon.wait()
    for proc in workers:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(workers, timeout=10)


def poll(check: Callable[[], T | None], deadline: float, what: str, run: str = "catch-up") -> T:
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"the {run} run timed out waiting for {what}")
        time.sleep(0.01)


def _iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1e6):06d}+00:00"


def _recorded(home: str, names: Sequence[str]) -> dict[str, float]:
    """The due time the daemon's file of each of ``names`` holds, of those that hold one."""
    recorded = {}
    for name in names:
        derived = read_derived(home, name)
        when = parse_time(derived.next) if derived is not None and derived.next else None
        if when is not None:
            recorded[name] = when
    return recorded


def _delivered(home: str, name: str) -> list[float]:
    """When each ``User`` of ``DUE_KEY`` in ``name``'s logs was written."""
    found: list[float] = []

    def collect(records: Sequence[Record]) -> None:
        found.extend(parse_time(r.time) or 0.0 for r in records
                     if isinstance(r, User) and r.key == DUE_KEY)  # fmt: skip

    try:
        load_session(session_dir(home, name), name, on_epoch=collect, history=True)
    except (SessionError, OSError):
        return []  # being written, or not there: asked again
    return found


def _worker_pids(home: str, names: Sequence[str]) -> dict[str, int] | None:
    """Each session's worker pid from ``status``; None until every one has a worker."""
    rows = call(home, "status")
    pids = {}
    if isinstance(rows, list):
        for row in rows:
            if isinstance(row, dict) and isinstance(row.get("pid"), int):
                pids[str(row["session"])] = int(row["pid"])
    return pids if set(names) <= set(pids) else None


def _woken(home: str, offset: int, names: Sequence[str]) -> list[str] | None:
    """The sessions in the order the restarted serve started their workers, from its
    events (``<time> <id> IDLE -> STARTING``) after ``offset`` of its stderr; None until
    each has one. Not the workers' pids: a spare worker (docs/templates.md) is forked
    before the start it serves, so a later start's worker can have the lower pid."""
    with open(serve_stderr(home), "rb") as file:
        file.seek(offset)
        text = file.read().decode(errors="replace")
    order: list[str] = []
    for line in text.splitlines():
        found = _STARTED.search(line)
        if found is not None and found[1] in names and found[1] not in order:
            order.append(found[1])
    return order if len(order) == len(names) else None
