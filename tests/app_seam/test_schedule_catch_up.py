"""The catch-up after a restart: the schedules that came due while no supervisor ran.

The restarted daemon finds every such session's timer due at once. Each delivery may
wake a hibernated session (a fork of the daemon); begun all in the loop's first turn,
they held it for the whole burst before it read a control request or a woken worker's
ready (issue 33). They are begun a few a turn (supervisor/scheduling/timers.py): a request
that waits in the control socket when the loop starts is answered amid the catch-up, and
every schedule is still delivered once, none early. The sessions with a schedule overdue
are woken first, the oldest first, then the live ones with nothing known to be due.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Final

import psutil
import pytest

from chaos.proc_states import all_stopped
from supervisor.client.control import encode_request, open_control, result_of
from supervisor.client.direct import Client
from supervisor.control_socket import SOCKET_NAME
from supervisor.scheduling.files import read_derived
from supervisor.scheduling.timers import DELIVERIES_PER_TURN
from tests.harness.support import REPO, Daemon, kill_node, poll_until
from worker.ipc.wire import FrameReader, Message
from worker.store.schedules import parse_time

pytestmark = pytest.mark.timeout(240)
SESSIONS: Final = 10 * DELIVERIES_PER_TURN
"""Enough overdue sessions for the catch-up to last well past the turns it takes the
loop to accept a connection and read its request (about five)."""
AHEAD: Final = 8.0
"""Seconds from a schedule's making to its time: past the scheduling of every session
and the supervisor's stop, so that each comes due while no supervisor runs."""
SLOW_SESSIONS: Final = 4
TURN_SECONDS: Final = 2.0


def _iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1e6):06d}+00:00"


def _delivered(home: Path, session: str, key: str) -> list[float]:
    """The times of the User records of ``key`` in every log of ``session``."""
    found = []
    for log in (home / "sessions" / session).glob("*.jsonl"):
        for line in log.read_bytes().splitlines():
            record = json.loads(line)
            if record["type"] == "User" and record["key"] == key:
                found.append(parse_time(record["time"]) or 0.0)
    return found


def _recorded(home: Path, names: list[str]) -> dict[str, float]:
    """The due time the daemon's file of each of ``names`` holds, of those that hold one."""
    recorded = {}
    for name in names:
        derived = read_derived(str(home), name)
        when = parse_time(derived.next) if derived is not None and derived.next else None
        if when is not None:
            recorded[name] = when
    return recorded


def _schedule_then_stop(
    home: Path, names: list[str], *args: str, resting: tuple[str, ...] = (), kill: bool = False
) -> dict[str, float]:
    """Create ``resting`` and ``names``, schedule ``due`` in each of ``names`` AHEAD
    seconds on, and stop the supervisor before any is due: SIGTERM, or with ``kill`` a
    SIGKILL of it and every worker (all running: each session's file says live). Each
    schedule's due time."""
    daemon = Daemon(home, "--idle-stop", "600" if kill else "0.3", *args)
    try:
        due = {}
        with Client(str(home), timeout=60) as client:
            for name in [*resting, *names]:
                client.call("create", session=name)
            for name in names:
                answer = client.schedule(name, _iso(time.time() + AHEAD), "later", key="due")
                due[name] = parse_time(str(answer["at"])) or 0.0
        if kill:
            # Every schedule in the daemon's files before the kill: the files are written
            # as the workers report, a moment after each answer (later on a loaded machine).
            poll_until(
                lambda: len(_recorded(home, names)) == len(names),
                timeout=60, what="every schedule recorded",
            )  # fmt: skip
            kill_node(daemon)
    finally:
        assert daemon.stop() in ((-signal.SIGKILL,) if kill else (0,))
    early = [name for name in names if _delivered(home, name, "due")]
    assert not early, f"due before the supervisor stopped (a slow setup): {early}"
    poll_until(lambda: time.time() > max(due.values()), timeout=60, what="every schedule due")
    return due


@contextmanager
def _serve(home: Path, *args: str, module: str = "supervisor") -> Iterator[subprocess.Popen[bytes]]:
    """``loopd serve`` run by ``module``; stopped (SIGCONT, SIGTERM) and reaped at the end."""
    with open(home.parent / "restarted.serve.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, "serve", "--home", str(home), *args],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield proc
    finally:
        workers = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        with suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        _gone, alive = psutil.wait_procs(workers, timeout=10)
        for worker in alive:
            worker.kill()


def _read_reply(sock: socket.socket) -> Message:
    reader = FrameReader()
    while True:
        data = sock.recv(1 << 16)
        assert data, "the supervisor closed the connection without a reply"
        replies = reader.feed(data)
        if replies:
            return replies[0]


@contextmanager
def _states_at_restart(home: Path) -> Iterator[dict[str, str]]:
    """Restart serve, stopped once it listens; send ``status`` before its loop runs and
    resume it: each session's state as that status found it (serve runs on in the block)."""
    stopping = "tests.programs.serve_stop_once_listening"
    with _serve(home, "--idle-stop", "30", module=stopping) as proc:
        poll_until(partial(all_stopped, proc.pid), timeout=60, what="serve to stop, listening")
        assert (home / SOCKET_NAME).exists()
        with open_control(str(home), 30) as sock:
            sock.sendall(encode_request({"id": 1, "op": "status"}))  # read once it runs
            sock.settimeout(60)
            proc.send_signal(signal.SIGCONT)
            rows = result_of(_read_reply(sock))
        assert isinstance(rows, list)
        yield {str(row["session"]): str(row["state"]) for row in rows if isinstance(row, dict)}


def test_a_request_waiting_at_a_restart_is_answered_before_the_catch_up_has_woken_every_session(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    names = [f"s{n:02d}" for n in range(SESSIONS)]
    due = _schedule_then_stop(home, names)
    with _states_at_restart(home) as states:
        assert sorted(states) == names
        # Answered while sessions with a schedule due still rested: not after all the wakes.
        assert sum(state == "IDLE" for state in states.values()) >= DELIVERIES_PER_TURN, states
        for name in names:
            times = poll_until(partial(_delivered, home, name, "due"), timeout=120, what=name)
            assert len(times) == 1, (name, times)
            assert times[0] >= due[name], (name, times[0], due[name])


def test_the_catch_up_wakes_the_sessions_with_a_schedule_overdue_first_then_the_live_ones(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    # The live sessions with nothing due sort first by name: woken first, were the
    # catch-up in the order of the files.
    resting = tuple(f"a{n:02d}" for n in range(SESSIONS // 2))
    overdue = [f"b{n:02d}" for n in range(SESSIONS // 2)]  # scheduled in this order
    _schedule_then_stop(home, overdue, resting=resting, kill=True)
    recorded = _recorded(home, overdue)  # each due time, as the restarted daemon reads it
    assert len(recorded) == len(overdue), recorded
    live = set(resting)
    with _states_at_restart(home) as states:
        woken = {name for name, state in states.items() if state != "IDLE"}
        assert 0 < len(woken) < len(overdue) + len(resting), states  # answered amid it
        # The overdue ones in the order they came due, before any live one; in the files'
        # order the live ones, which sort first, would all come before them.
        woken_overdue = woken & set(recorded)
        in_order = sorted(recorded, key=recorded.__getitem__)
        assert woken_overdue == set(in_order[: len(woken_overdue)]), sorted(woken)
        assert len(woken_overdue) > len(woken & live), sorted(woken)
        for name in overdue:
            poll_until(partial(_delivered, home, name, "due"), timeout=120, what=name)


def test_the_catch_up_of_sessions_with_a_slow_app_runs_their_turns_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    names = [f"slow{n}" for n in range(SLOW_SESSIONS)]
    app = ("--app", "tests.apps.slow_apps:SlowTurnApp")
    monkeypatch.setenv("LOOPD_TEST_TURN_SECONDS", "0")  # the setup's requests are quick
    _schedule_then_stop(home, names, *app)
    monkeypatch.setenv("LOOPD_TEST_TURN_SECONDS", str(TURN_SECONDS))
    with _serve(home, "--idle-stop", "30", *app):
        for name in names:
            poll_until(partial(_delivered, home, name, "due"), timeout=120, what=name)
    first = {name: _delivered(home, name, "due")[0] for name in names}
    # One after another, the last would begin (SLOW_SESSIONS - 1) turns after the first.
    assert max(first.values()) - min(first.values()) < TURN_SECONDS, first
