"""A whole service frozen and thawed (a cgroup freezer, ``docker pause``, a paused VM):
time the daemon did not run is no evidence against a worker.

Each test runs a real ``loopd serve`` and freezes it with its workers by SIGSTOP,
every thread of each seen stopped before the freeze counts (tests.harness.support.stop). How
long the freeze lasts is the fault under test, so the test holds it for a fixed time.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from chaos.proc_states import all_stopped
from supervisor.client import Client, call
from supervisor.errors import ControlError
from tests.harness.support import (
    Daemon,
    log_user_keys,
    poll_until,
    running_daemon,
    status,
    stop,
    wait_state,
)

HANG_TIMEOUT = 2.0
FREEZE = 5.0
"""Seconds each freeze lasts: well past the hang timeout."""
WATCHED = 4 * HANG_TIMEOUT
"""Seconds the sessions are watched after a thaw: a hang kill would land in the first."""


def _rows(home: Path, sessions: list[str]) -> dict[str, dict[str, object]]:
    return {session: status(home, session) for session in sessions}


def _freeze(daemon: Daemon, pids: list[int], seconds: float) -> None:
    """Stop the daemon and the workers (the daemon first: it cannot see them stop one by
    one), hold the freeze, check that all stayed stopped, continue them all (the daemon
    first: it runs before them, as a thawed daemon may)."""
    frozen = [stop(daemon.proc)]
    try:
        frozen += [stop(pid) for pid in pids]
        time.sleep(seconds)  # the freeze's length is the fault, not a wait for a condition
        resumed = [pid for pid in frozen if not all_stopped(pid)]
        assert not resumed, f"a frozen process ran during the freeze: {resumed}"
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)


@pytest.mark.timeout(120)
def test_a_thawed_service_kills_none_of_its_idle_workers_as_hung(tmp_path: Path) -> None:
    home = tmp_path / "home"
    sessions = [f"s{n}" for n in range(8)]
    with running_daemon(home, "--hang-timeout", str(HANG_TIMEOUT)) as daemon:
        for session in sessions:
            call(str(home), "create", session=session)
        before = {s: wait_state(home, s, "RUNNING") for s in sessions}
        pids = [int(str(row["pid"])) for row in before.values()]
        _freeze(daemon, pids, FREEZE)
        # Watched for several hang periods: a worker killed in them shows a new pid.
        deadline = time.monotonic() + WATCHED
        while time.monotonic() < deadline:
            rows = _rows(home, sessions)
            changed = {
                s: (row["state"], row["restarts"], row["last_error"])
                for s, row in rows.items()
                if row["pid"] != before[s]["pid"] or row["restarts"] != 0
            }
            assert not changed, f"workers killed after the thaw: {changed}"
            time.sleep(0.2)  # spaces the checks; the window's length is what is tested
        with Client(str(home), timeout=30, retry_for=0) as client:
            assert client.send("s0", "after the thaw", key="after")["duplicate"] is False


@pytest.mark.timeout(150)
def test_a_request_caught_by_three_freezes_is_answered_and_not_refused_as_poison(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    env = {"LOOPD_TEST_TURN_SECONDS": "8"}  # eight one-second steps, progress after each
    args = ("--app", "tests.apps.slow_apps:ProgressApp", "--hang-timeout", str(HANG_TIMEOUT))
    replies: list[dict[str, object]] = []
    caught: list[ControlError] = []
    with running_daemon(home, *args, env=env) as daemon:
        call(str(home), "create", session="s")
        wait_state(home, "s", "RUNNING")

        def send() -> None:
            try:
                with Client(str(home), timeout=100, retry_for=60) as client:
                    replies.append(client.send("s", "a long tool loop", key="long"))
            except ControlError as exc:
                caught.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        try:
            for _ in range(3):

                def turn_running() -> int | None:
                    pid = status(home, "s")["pid"]
                    if isinstance(pid, int) and (home / f"turn-{pid}").exists():
                        return pid
                    return None

                pid = poll_until(turn_running, timeout=60, what="the turn to run")
                _freeze(daemon, [pid], FREEZE)
        finally:
            sender.join(timeout=100)
        row = status(home, "s")
    assert not caught, f"{caught[0].code}: {caught[0]}" if caught else ""
    assert replies
    assert replies[0]["duplicate"] is False
    assert row["restarts"] == 0, row["last_error"]
    assert log_user_keys(home, "s") == ["long"]
