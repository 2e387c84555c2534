"""A step of the system clock changes nothing serve knows of its workers.

The boot time in wall-clock seconds moves with the clock (``btime`` in ``/proc/stat``);
serve told its workers apart from later processes of the same pid by a creation time
that added it, so after a step it took every running worker for another process and
signalled none: a stopped worker was never killed as hung, its clients waited for good.
Serve runs in a mount namespace of its own (tests.programs.serve_own_boot_time), where
the test moves ``btime`` and the machine's clock stays as it is.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

from chaos.run.mutant_serve import step_clock
from supervisor.client import call
from tests.harness.support import poll_until, running_daemon, status, stop, wait_state

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for a mount namespace")


def test_a_worker_stopped_after_a_clock_step_is_still_killed_as_hung(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_bytes(Path("/proc/stat").read_bytes())
    home = tmp_path / "home"
    env = {"LOOPD_TEST_STAT": str(stat)}
    with running_daemon(home, "--hang-timeout", "1", "--backoff-base", "0.01",
                        env=env, module="tests.programs.serve_own_boot_time"):  # fmt: skip
        call(str(home), "create", session="s")
        row = wait_state(home, "s", "RUNNING")
        first = row["pid"]
        assert isinstance(first, int)
        step_clock(str(stat), 7)
        stop(first)
        try:
            # Killed as hung and started again: a new worker, and the hang said why.
            row = poll_until(
                lambda: _restarted(home, first),
                timeout=60,
                what="the stopped worker to be killed as hung and the session to run again",
            )
        finally:
            with contextlib.suppress(ProcessLookupError):  # never left stopped for teardown
                os.kill(first, signal.SIGCONT)
        assert "hang" in str(row.get("last_error")), row


def _restarted(home: Path, first: int) -> dict[str, object] | None:
    """The session's row once a worker other than ``first`` runs it."""
    row = status(home, "s")
    return row if row["state"] == "RUNNING" and row["pid"] != first else None
