"""The supervisor's loop: events that land in one turn, and when its socket appears."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from supervisor.client import call
from supervisor.control_socket import SOCKET_NAME
from tests.harness.support import REPO, poll_until, running_daemon, status, stop, wait_state


def _is_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_death_handled_before_its_channel_end_in_one_turn_is_restarted_and_serving_goes_on(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    # Deaths first in every batch: the turn that reaps the worker (and closes its channel)
    # still holds the channel's end-of-stream event, which is stale by then.
    with running_daemon(home, module="tests.programs.serve_pidfd_first") as daemon:
        call(str(home), "create", session="s1")
        victim = wait_state(home, "s1", "RUNNING")["pid"]
        assert isinstance(victim, int)
        # Frozen, the daemon sees the death and the channel's end in one select().
        stop(daemon.proc)
        try:
            os.kill(victim, signal.SIGKILL)
            poll_until(lambda: _is_zombie(victim), what="the worker to be dead, unreaped")
        finally:
            os.kill(daemon.proc.pid, signal.SIGCONT)

        def restarted() -> dict[str, object] | None:
            row = status(home, "s1")
            return row if row["state"] == "RUNNING" and row["pid"] != victim else None

        row = poll_until(restarted, what="the restarted worker")
        assert row["restarts"] == 1
        assert row["last_error"] == "worker killed by SIGKILL"
        assert daemon.proc.poll() is None
        assert call(str(home), "send", session="s1", text="after", key="k")
        assert daemon.stop() == 0


def test_the_control_socket_appears_only_once_the_daemon_listens_on_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.programs.serve_stop_before_listen",
            "serve",
            "--home",
            str(home),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        poll_until(
            lambda: psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED,
            what="the daemon to stop itself before listen()",
        )
        # A client that waits for the socket file must never find one that refuses it.
        assert not (home / SOCKET_NAME).exists()
        os.kill(proc.pid, signal.SIGCONT)
        poll_until((home / SOCKET_NAME).exists, what="the control socket")
        assert call(str(home), "ping")
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
