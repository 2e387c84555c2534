"""The supervisor's loop when several events of one worker land in the same turn."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil

from supervisor.client import call
from tests.support import poll_until, running_daemon, status, wait_state


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
    with running_daemon(home, module="tests.serve_pidfd_first") as daemon:
        call(str(home), "create", session="s1")
        victim = wait_state(home, "s1", "RUNNING")["pid"]
        assert isinstance(victim, int)
        # Frozen, the daemon sees the death and the channel's end in one select().
        os.kill(daemon.proc.pid, signal.SIGSTOP)
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
