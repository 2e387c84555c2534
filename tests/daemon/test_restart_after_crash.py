"""A supervisor SIGKILLed while a worker is busy: the next supervisor waits for the old
worker (which still holds the session's lock) to finish and exit, bounded, then starts
the session, instead of marking it FATAL. Real daemons, workers and signals."""

from __future__ import annotations

import ctypes
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psutil
import pytest

from supervisor.client import Client, call
from supervisor.client.control import exchange, open_control
from tests.harness.support import Daemon, poll_until, status
from worker import Session
from worker.ipc.wire import encode
from worker.store.format.records import User

SLOW = ("--app", "tests.apps.edge_apps:SlowApp")
_PR_SET_CHILD_SUBREAPER = 36


@contextmanager
def orphans_come_to_us() -> Iterator[None]:
    """Make this process the subreaper of its descendants for the test, so the workers a
    killed supervisor leaves behind are ours to reap (and none is left running)."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield
    finally:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def reap(pid: int) -> None:
    """Wait for an orphan that came to us; kill it if it outlives the test's deadline."""
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    _gone, alive = psutil.wait_procs([proc], timeout=20)
    for left in alive:
        left.kill()
    with suppress(ChildProcessError):  # reaped by someone else: it was not ours after all
        os.waitpid(pid, 0)


def keys_in_log(home: Path, session: str) -> list[str]:
    with Session.open(home, session) as opened:
        return [str(r.key) for r in opened.records if isinstance(r, User)]


def _states_until_running(home: Path, seen: list[str]) -> bool:
    row = status(home, "s")
    seen.append(f"{row['state']}: {row['last_error']}")
    return row["state"] == "RUNNING"


def _in_request(home: Path, pid: int, key: str) -> bool:
    marker = home / f"sleeping-{pid}"
    return marker.exists() and marker.read_text() == key


@pytest.mark.timeout(100)
@pytest.mark.parametrize("method", ["fork", "exec"])
def test_a_busy_worker_of_a_killed_supervisor_is_waited_for_then_the_session_starts(
    tmp_path: Path, method: str
) -> None:
    home = tmp_path / "home"
    args = (*SLOW, "--start-method", method)
    with orphans_come_to_us():
        first = Daemon(home, *args)
        old: int | None = None
        second: Daemon | None = None
        try:
            call(str(home), "create", session="s")
            old = int(str(status(home, "s")["pid"]))
            outcome: dict[str, Any] = {}

            def client() -> None:
                with Client(str(home), timeout=30, retry_for=40) as direct:
                    outcome["reply"] = direct.send("s", "sleep 4", key="slow")

            thread = threading.Thread(target=client)
            thread.start()
            poll_until(lambda: _in_request(home, old or 0, "slow"), what="the slow request")
            first.proc.kill()  # SIGKILL: the worker is left busy, holding the session's lock
            first.proc.wait()
            second = Daemon(home, *args)
            seen: list[str] = []
            poll_until(lambda: _states_until_running(home, seen), timeout=30,
                       what="the session to start after the old worker's exit")  # fmt: skip
            assert not [state for state in seen if state.startswith("FATAL")], seen
            assert not psutil.pid_exists(old) or psutil.Process(old).status() == "zombie"
            row = status(home, "s")
            assert row["pid"] != old
            assert row["last_error"] is None
            thread.join(timeout=60)
            assert outcome["reply"]["key"] == "slow"  # answered: by the old worker or the log
            with Client(str(home)) as direct:
                assert direct.send("s", "after", key="after")["duplicate"] is False
        finally:
            for daemon in (first, second):
                if daemon is not None:
                    daemon.stop()
            if old is not None:
                reap(old)
    assert keys_in_log(home, "s") == ["slow", "after"]


@pytest.mark.timeout(100)
def test_an_old_worker_still_busy_past_the_hang_timeout_is_killed_then_the_session_starts(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    args = (*SLOW, "--hang-timeout", "2")
    with orphans_come_to_us():
        first = Daemon(home, *args)
        old: int | None = None
        second: Daemon | None = None
        link: socket.socket | None = None
        try:
            call(str(home), "create", session="s")
            old = int(str(status(home, "s")["pid"]))
            link = _direct(home)  # no retry: the request must not be sent again
            request = {"text": "sleep 600", "key": "stuck"}
            link.sendall(encode({"id": 1, "op": "request", "request": request}))
            poll_until(lambda: _in_request(home, old or 0, "stuck"), what="the stuck request")
            first.proc.kill()
            first.proc.wait()
            second = Daemon(home, *args)
            seen: list[str] = []
            poll_until(lambda: _states_until_running(home, seen), timeout=30,
                       what="the session to start after the old worker was killed")  # fmt: skip
            assert not [state for state in seen if state.startswith("FATAL")], seen
            waiting = (
                f"BACKOFF: the session is locked by pid {old}, an earlier worker of it (a "
                "previous supervisor's, or one a template forked before it died) finishing "
                "its last batch: waiting up to 2 s for it to exit"
            )
            assert waiting in seen  # waited for first, then killed
            assert not psutil.pid_exists(old) or psutil.Process(old).status() == "zombie"
            assert link.recv(1 << 16) == b""  # killed mid-request: no reply, an end of stream
            with Client(str(home)) as direct:
                assert direct.send("s", "after", key="after")["duplicate"] is False
        finally:
            if link is not None:
                link.close()
            for daemon in (first, second):
                if daemon is not None:
                    daemon.stop()
            if old is not None:
                reap(old)
    assert keys_in_log(home, "s") == ["after"]  # the killed request was never applied


def _direct(home: Path) -> socket.socket:
    control = open_control(str(home), 10)
    try:
        replies, fds = exchange(
            control, encode({"id": 1, "op": "connect", "session": "s"}), 1,
            time.monotonic() + 10,
        )  # fmt: skip
    finally:
        control.close()
    assert replies[0]["ok"] is True, replies
    link = socket.socket(fileno=fds[0])
    link.settimeout(30)
    return link
