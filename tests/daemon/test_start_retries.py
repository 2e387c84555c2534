"""A crash loop is a crash loop however slow the start: failed starts are counted."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.client import call
from supervisor.errors import ControlError
from tests.apps.slow_start_apps import REASON, SLOW_START_ENV
from tests.harness.support import running_daemon, status, wait_state

APP = ("--app", "tests.apps.slow_start_apps:slow_failing_app")


def test_a_worker_that_fails_every_slow_start_goes_fatal_with_the_apps_error(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    # Each start takes 2 s before it fails: at most about five restarts fit in any 10 s
    # window, so the restart window alone never calls it FATAL (it stayed in BACKOFF).
    with running_daemon(home, *APP, "--start-retries", "2", env={SLOW_START_ENV: "2"}):
        began = time.monotonic()
        created = subprocess.run(
            [sys.executable, "-m", "supervisor", "create", "--home", str(home), "s1",
             "--timeout", "90"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        took = time.monotonic() - began
        assert created.returncode != 0
        assert "Traceback" not in created.stderr
        assert "3 starts in a row ended before the worker was ready" in created.stderr
        assert REASON in created.stderr  # the App's own error, not a timeout
        assert took < 80, took  # answered when it went FATAL, not at the client's timeout
        row = wait_state(home, "s1", "FATAL")
        assert "--start-retries 2" in str(row["last_error"])
        assert REASON in str(row["last_error"])


def test_the_default_counts_failed_starts_too_and_a_ready_worker_resets_the_count(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, *APP, env={SLOW_START_ENV: "2"}):
        with pytest.raises(ControlError, match="6 starts in a row ended before the worker was"):
            call(str(home), "create", session="bad", timeout=90)
        row = wait_state(home, "bad", "FATAL")
        assert "(--start-retries 5)" in str(row["last_error"])
        assert REASON in str(row["last_error"])
    home2 = tmp_path / "home2"
    with running_daemon(home2):  # the default App: every start reaches ready
        call(str(home2), "create", session="ok")
        assert status(home2, "ok")["state"] == "RUNNING"


def test_a_start_that_never_says_ready_is_killed_at_the_start_timeout_and_counted(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    args = ("--app", "tests.apps.slow_start_apps:never_ready_app", "--start-timeout", "2",
            "--start-retries", "1")  # fmt: skip
    with running_daemon(home, *args):
        # Before, the session stayed STARTING for ever and create timed out, blaming the
        # supervisor.
        with pytest.raises(ControlError, match="2 starts in a row ended before the worker"):
            call(str(home), "create", session="s1", timeout=60)
        row = wait_state(home, "s1", "FATAL")
        assert "not ready within 2 s (--start-timeout)" in str(row["last_error"])
