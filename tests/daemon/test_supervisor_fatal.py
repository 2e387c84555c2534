"""Sessions a restart cannot help go FATAL at once, and what status then says stays small."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from supervisor.client import call
from supervisor.sessions.hosted import MAX_LAST_ERROR
from tests.conftest import HUGE_LINE
from tests.harness.support import poll_until, running_daemon, status, wait_state
from worker import Session
from worker.app import DefaultApp


def _session(home: Path, name: str) -> Path:
    Session.create(home, name, DefaultApp().initial_baseline(name)).close()
    return home / "sessions" / name


@pytest.mark.parametrize("name", ["0.jsonl", "0.baseline.json"], ids=["log", "baseline"])
def test_a_session_whose_file_is_a_directory_goes_fatal_at_once_naming_it_and_the_next_step(
    tmp_path: Path, name: str
) -> None:
    home = tmp_path / "home"
    path = _session(home, "s1") / name
    path.unlink()
    path.mkdir()
    with running_daemon(home) as daemon:
        row = wait_state(home, "s1", "FATAL")
        assert row["restarts"] == 0
        error = str(row["last_error"])
        assert error.startswith(f"{path}: is a directory, not a regular file")
        assert "`loopd start s1`" in error
        assert daemon.workers() == []


def test_a_session_whose_disk_fails_every_open_goes_fatal_at_once_naming_it_and_the_next_step(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    directory = _session(home, "s1")
    with running_daemon(
        home, "--app", "tests.apps:eio_syncing_the_session_directory_app"
    ) as daemon:
        row = wait_state(home, "s1", "FATAL")
        assert row["restarts"] == 0
        error = str(row["last_error"])
        assert error.startswith(f"{directory}: fsync of directory failed: [EIO]")
        assert "a restart will not fix" in error
        assert "`loopd start s1`" in error
        assert daemon.workers() == []


def test_status_answers_when_two_sessions_refuse_lines_quoting_huge_values(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    logs = {}
    for name in ("big1", "big2"):
        logs[name] = _session(home, name) / "0.jsonl"
        with logs[name].open("ab") as f:
            f.write(HUGE_LINE)
    with running_daemon(home):
        for name, log in logs.items():
            row = wait_state(home, name, "FATAL")
            assert row["restarts"] == 0  # refused (exit 4), not a crash loop
            error = str(row["last_error"])
            assert error.startswith(f"{log}:2: ")
            assert "loopd repair" in error
            assert len(error) <= MAX_LAST_ERROR
        rows = call(str(home), "status")
        assert isinstance(rows, list)
        assert [r["state"] for r in rows] == ["FATAL", "FATAL"]


def test_last_error_tells_the_last_exit_only_however_often_the_worker_was_killed(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home):
        call(str(home), "create", session="s1")
        for restarts in (1, 2, 3):
            victim = wait_state(home, "s1", "RUNNING")["pid"]
            assert isinstance(victim, int)
            os.kill(victim, signal.SIGKILL)

            def restarted(old: int = victim, n: int = restarts) -> dict[str, object] | None:
                row = status(home, "s1")
                ok = row["state"] == "RUNNING" and row["pid"] != old and row["restarts"] == n
                return row if ok else None

            row = poll_until(restarted, what=f"restart {restarts}")
            assert row["last_error"] == "worker killed by SIGKILL"
