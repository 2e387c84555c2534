"""The supervisor with real workers: restarts, in-flight errors, FATAL, locks, shutdown."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path

import msgpack
import psutil
import pytest

from supervisor.client import call
from supervisor.control_socket import SOCKET_NAME
from supervisor.errors import ControlError
from tests.conftest import torn_session
from tests.harness.support import Daemon, loopd, poll_until, running_daemon, status, wait_state
from worker import Session, User
from worker.app import DefaultApp

BLOCKING = ("--app", "tests.apps:BlockingApp")


def _users(home: Path, session: str) -> list[User]:
    """Every User record of every epoch, read back from the files."""
    users = []
    directory = home / "sessions" / session
    for log in sorted(directory.glob("*.jsonl"), key=lambda p: int(p.name.split(".")[0])):
        for line in log.read_bytes().splitlines():
            record = json.loads(line)
            if record["type"] == "User":
                users.append(
                    User(
                        time=record["time"],
                        text=record["text"],
                        untrusted=record["untrusted"],
                        key=record["key"],
                    )
                )
    return users


@pytest.mark.parametrize("method", ["fork", "exec"])
def test_a_sigkilled_worker_is_restarted_and_resumes_with_every_acknowledged_record(
    tmp_path: Path, method: str
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--start-method", method) as daemon:
        call(str(home), "create", session="s1", slot=3)
        acknowledged = [f"k{n}" for n in range(5)]
        for key in acknowledged:
            call(str(home), "send", session="s1", text=f"text {key}", key=key)
        before = wait_state(home, "s1", "RUNNING")
        assert before["restarts"] == 0
        old_pid = before["pid"]
        assert isinstance(old_pid, int)
        os.kill(old_pid, signal.SIGKILL)

        def restarted() -> dict[str, object] | None:
            row = status(home, "s1")
            return row if row["state"] == "RUNNING" and row["pid"] != old_pid else None

        after = poll_until(restarted, what="the restarted worker")
        assert after["restarts"] == 1
        assert "SIGKILL" in str(after["last_error"])
        assert after["records"] == 1 + 4 * len(acknowledged)
        reply = call(str(home), "send", session="s1", text="after", key="k-after")
        assert isinstance(reply, dict)
        assert reply["call"] == len(acknowledged) + 1  # next_call resumed, never reused
        assert daemon.stop() == 0
    assert [u.key for u in _users(home, "s1")] == [*acknowledged, "k-after"]


@pytest.mark.parametrize("when", ["block-after", "block-before"])
def test_a_request_in_flight_when_the_worker_dies_gets_an_error_and_its_retry_applies_once(
    tmp_path: Path, when: str
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, *BLOCKING):
        call(str(home), "create", session="s1")
        outcome: dict[str, object] = {}

        def send() -> None:
            try:
                outcome["result"] = call(str(home), "send", session="s1", text=when, key="once")
            except ControlError as exc:
                outcome["error"] = exc

        sender = threading.Thread(target=send)
        sender.start()
        marker = poll_until(
            lambda: next(iter(home.glob("blocked-*")), None), what="the worker to hold the request"
        )
        os.kill(int(marker.name.split("-")[1]), signal.SIGKILL)
        sender.join(timeout=30)
        assert not sender.is_alive()
        failure = outcome.get("error")
        assert isinstance(failure, ControlError)
        assert failure.code == "worker_died"
        assert "retry with the same key" in failure.message
        retry = call(str(home), "send", session="s1", text=when, key="once")
        assert isinstance(retry, dict)
        assert retry["duplicate"] is (when == "block-after")
    assert [u.key for u in _users(home, "s1")] == ["once"]


def test_a_worker_on_a_torn_log_goes_fatal_once_with_path_line_and_the_next_step(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    log = torn_session(home, "torn")
    with running_daemon(home) as daemon:
        row = wait_state(home, "torn", "FATAL")
        assert row["restarts"] == 0
        assert f"{log}:2: last line has no newline" in str(row["last_error"])
        assert "loopd repair" in str(row["last_error"])
        assert row["pid"] is None
        # No crash loop: no worker is running for it, and it stays FATAL.
        assert daemon.workers() == []
        assert status(home, "torn")["state"] == "FATAL"
        with pytest.raises(ControlError, match="FATAL"):
            call(str(home), "send", session="torn", text="x")


def test_a_worker_that_always_crashes_at_start_goes_fatal_after_the_limit_with_backoff(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    Session.create(home, "bad", DefaultApp().initial_baseline("bad")).close()
    crash_log = tmp_path / "starts"
    args = (
        "--app",
        "tests.apps:crashing_app",
        "--max-restarts",
        "3",
        "--restart-window",
        "60",
        "--backoff-base",
        "0.05",
    )
    with running_daemon(home, *args, env={"LOOPD_TEST_CRASH_LOG": str(crash_log)}):
        row = wait_state(home, "bad", "FATAL")
        assert row["restarts"] == 3
        assert "more than 3 restarts in 60 s" in str(row["last_error"])
        assert "always crashes" in str(row["last_error"])
    starts = [float(t) for t in crash_log.read_text().split()]
    assert len(starts) == 4  # the first start and three restarts
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # Immediate first restart, then 0.05 s, then 0.1 s at least (plus jitter).
    assert gaps[1] >= 0.05
    assert gaps[2] >= 0.1


def test_a_second_serve_on_the_same_home_exits_non_zero_naming_the_holder(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home) as daemon:
        second = loopd("serve", "--home", str(home))
        assert second.returncode != 0
        assert f"pid {daemon.proc.pid}" in second.stderr


def test_a_second_worker_for_a_live_session_gets_lock_held(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home):
        call(str(home), "create", session="s1")
        holder = status(home, "s1")["pid"]
        ours, theirs = socket.socketpair()
        try:
            proc = psutil.Popen(
                [
                    sys.executable,  # the venv's interpreter; exe() resolves to the base one
                    "-m",
                    "worker",
                    "--home",
                    str(home),
                    "--session",
                    "s1",
                    "--channel-fd",
                    str(theirs.fileno()),
                ],
                pass_fds=(theirs.fileno(),),
            )
            theirs.close()
            assert proc.wait(timeout=30) == 3
            said = msgpack.unpackb(ours.recv(65536), raw=False)
        finally:
            ours.close()
        assert said["code"] == "locked"
        assert said["holder"] == holder


def test_a_sigkilled_supervisor_leaves_no_worker_running(tmp_path: Path) -> None:
    home = tmp_path / "home"
    daemon = Daemon(home)
    try:
        for name in ("a", "b", "c"):
            call(str(home), "create", session=name)
        workers = daemon.workers()
        assert len(workers) == 3
        daemon.proc.kill()
        daemon.proc.wait(timeout=10)
        _gone, alive = psutil.wait_procs(workers, timeout=10)
        assert alive == []
    finally:
        daemon.stop()


def test_sigterm_to_the_supervisor_stops_every_worker_and_exits_0(tmp_path: Path) -> None:
    home = tmp_path / "home"
    daemon = Daemon(home)
    for name in ("a", "b"):
        call(str(home), "create", session=name)
    workers = daemon.workers()
    assert len(workers) == 2
    assert daemon.stop() == 0
    _gone, alive = psutil.wait_procs(workers, timeout=1)
    assert alive == []
    assert not (home / SOCKET_NAME).exists()
