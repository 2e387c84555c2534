"""An App that forks a helper: the helper never holds the session's lock or a client's
socket, and goes with its worker's process group.

Every test runs a real ``loopd serve`` (the default start method, auto: the App's
template forks its workers) hosting tests.apps.forking_apps:ForkingApp, and talks to it
through the real ``Client``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import suppress
from pathlib import Path

import psutil
import pytest

from supervisor.client import Client, call
from supervisor.errors import ControlError
from tests.harness.support import log_user_keys, poll_until, running_daemon, wait_state

APP = ("--app", "tests.apps.forking_apps:ForkingApp")
PROMPT = 30.0
"""Seconds within which a client is answered after its worker's death (its timeout is
twice that: a client that waits its timeout out fails the test)."""


def _helper_pids(home: Path) -> list[int]:
    path = home / "helper-pids"
    return [int(pid) for pid in path.read_text().split()] if path.exists() else []


def _helper_pid(home: Path) -> int:
    """The helper's pid, once the App wrote it down."""
    return poll_until(lambda: next(iter(_helper_pids(home)), None), what="the helper's pid")


def _running_helper(home: Path) -> int:
    """The helper's pid, once it runs (the fork's hooks ran in it)."""
    pid = _helper_pid(home)
    poll_until((home / f"helper-{pid}.running").exists, what=f"the helper {pid} to run")
    return pid


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _kill_helpers(home: Path) -> None:
    """Cleanup only: a helper reparented away from the test runner is not its child."""
    for pid in _helper_pids(home):
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _session_fds(pid: int, session_dir: Path) -> list[str]:
    """The descriptors of ``pid`` that refer to the session's directory (its lock)."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with suppress(FileNotFoundError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(session_dir):
                found.append(fd)
    return found


def _inheritable_fds(pid: int) -> list[str]:
    """The descriptors of ``pid`` above stdio without close-on-exec (an exec keeps them)."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with suppress(FileNotFoundError):
            with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                flags = next(line for line in info if line.startswith("flags:")).split()[1]
            if int(fd) > 2 and not int(flags, 8) & os.O_CLOEXEC:
                found.append(f"{fd} -> {os.readlink(f'/proc/{pid}/fd/{fd}')}")
    return found


@pytest.mark.parametrize("how", ["os.fork", "multiprocessing"])
@pytest.mark.timeout(120)
def test_a_worker_that_exits_after_its_app_forked_a_helper_restarts_and_answers_the_retry(
    tmp_path: Path, how: str
) -> None:
    home = tmp_path / "home"
    try:
        with running_daemon(home, *APP):
            call(str(home), "create", session="s")
            first = wait_state(home, "s", "RUNNING")["pid"]
            started = time.monotonic()
            with Client(str(home), timeout=2 * PROMPT, retry_for=PROMPT) as client:
                reply = client.send("s", f"{how} then crash", key="k")
            took = time.monotonic() - started
            helper = _helper_pid(home)
            row = wait_state(home, "s", "RUNNING")
            poll_until(lambda: _gone(helper), what=f"the helper {helper} to be killed")
    finally:
        _kill_helpers(home)
    assert took < PROMPT, f"the client waited {took:.1f} s for its answer"
    assert reply["duplicate"] is False
    assert row["pid"] != first
    assert row["restarts"] == 1, row["last_error"]
    assert "locked by" not in str(row["last_error"])
    assert log_user_keys(home, "s") == ["k"]


@pytest.mark.parametrize("how", ["os.fork", "multiprocessing"])
@pytest.mark.timeout(120)
def test_a_helper_holds_no_descriptor_of_the_session_and_dies_with_its_sigkilled_worker(
    tmp_path: Path, how: str
) -> None:
    home = tmp_path / "home"
    replies: list[dict[str, object]] = []
    caught: list[ControlError] = []
    try:
        with running_daemon(home, *APP):
            call(str(home), "create", session="s")
            first = wait_state(home, "s", "RUNNING")["pid"]
            assert isinstance(first, int)

            def send() -> None:
                try:
                    with Client(str(home), timeout=2 * PROMPT, retry_for=PROMPT) as client:
                        replies.append(client.send("s", f"{how} then hang", key="k"))
                except ControlError as exc:
                    caught.append(exc)

            sender = threading.Thread(target=send)
            sender.start()
            helper = _running_helper(home)
            held = _session_fds(helper, home / "sessions" / "s")
            inheritable = _inheritable_fds(first)  # its client's connection attached
            assert _session_fds(first, home / "sessions" / "s")  # what the check looks for
            os.kill(first, signal.SIGKILL)
            started = time.monotonic()
            sender.join(timeout=2 * PROMPT + 10)
            took = time.monotonic() - started
            row = wait_state(home, "s", "RUNNING")
            poll_until(lambda: _gone(helper), what=f"the helper {helper} to be killed")
    finally:
        _kill_helpers(home)
    assert not held, f"the helper holds the session's directory as fds {held}"
    assert not inheritable, f"the worker's descriptors an exec'd child keeps: {inheritable}"
    assert not caught, f"{caught[0].code}: {caught[0]}" if caught else ""
    assert took < PROMPT, f"the client waited {took:.1f} s for its answer"
    assert replies[0]["duplicate"] is False
    assert row["restarts"] == 1, row["last_error"]
    assert "locked by" not in str(row["last_error"])
    assert log_user_keys(home, "s") == ["k"]


@pytest.mark.timeout(120)
def test_a_helper_left_running_by_an_app_is_killed_when_serve_stops(tmp_path: Path) -> None:
    home = tmp_path / "home"
    try:
        with running_daemon(home, *APP) as daemon:
            call(str(home), "create", session="s")
            wait_state(home, "s", "RUNNING")
            with Client(str(home), timeout=2 * PROMPT, retry_for=0) as client:
                reply = client.send("s", "os.fork", key="k")
            helper = _running_helper(home)
            assert not _gone(helper)
            daemon.proc.send_signal(signal.SIGTERM)
            assert daemon.proc.wait(timeout=PROMPT) == 0
            poll_until(lambda: _gone(helper), timeout=5, what=f"the helper {helper} to be killed")
    finally:
        _kill_helpers(home)
    assert reply["duplicate"] is False
