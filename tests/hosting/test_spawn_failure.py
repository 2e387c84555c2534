"""A worker that cannot be spawned (serve out of descriptors): tried again from the loop
with a backoff, and served once descriptors are free again; real serve, real SIGKILL."""

from __future__ import annotations

import errno
import itertools
import os
import signal
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from supervisor.client import call, call_with_retry
from supervisor.sessions.spawn import StartMethod, WorkerProcess, WorkerSpec
from tests.harness.support import poll_until, running_daemon, status

SHORT_FOR = 7
"""Spawns that fail for want of descriptors before serve's limit is raised again."""


def test_a_worker_serve_cannot_spawn_is_started_again_once_it_can(tmp_path: Path) -> None:
    """With a run older than --stable-after behind it, each failed spawn reset the backoff
    to nothing and started again at once, nested: a failure lasting about 500 tries made
    a RecursionError, which left the session in BACKOFF with no timer, never started
    again; with the defaults, 6 failures in a row made it FATAL. Now each is tried again
    after a backoff, from the loop, for as long as the shortage lasts."""
    home = tmp_path / "home"
    # The default --start-retries (5) and --max-restarts: a shortage of serve's own is not
    # the session's failed start, and never makes it FATAL (it once did within 3 s).
    with running_daemon(home, "--stable-after", "0.2") as daemon:
        call(str(home), "create", session="s1")
        # The worker's run is older than --stable-after before it is killed.
        poll_until(lambda: float(status(home, "s1")["uptime_s"] or 0) > 0.5, what="uptime")  # type: ignore[arg-type]
        worker = int(status(home, "s1")["pid"])  # type: ignore[call-overload]
        serve = psutil.Process(daemon.proc.pid)
        soft, hard = serve.rlimit(psutil.RLIMIT_NOFILE)
        serve.rlimit(psutil.RLIMIT_NOFILE, (serve.num_fds() - 8, hard))  # no new descriptor
        try:
            os.kill(worker, signal.SIGKILL)
            # Spawns fail meanwhile (EMFILE): serve says so in its log, 7 times (more
            # than --start-retries and --max-restarts allow failures or restarts).
            poll_until(lambda: daemon.log_path.read_text(errors="replace").count(
                "could not start the worker") >= SHORT_FOR, timeout=60,
                what=f"{SHORT_FOR} failed spawns")  # fmt: skip
        finally:
            serve.rlimit(psutil.RLIMIT_NOFILE, (soft, hard))
        reply = call_with_retry(str(home), "send", session="s1", text="back", key="k1",
                                deadline=time.monotonic() + 60)  # fmt: skip
        assert isinstance(reply, dict)
        poll_until(lambda: status(home, "s1")["state"] == "RUNNING", what="s1 running")
        log = daemon.log_path.read_text(errors="replace")
        assert "RecursionError" not in log, log[-2000:]
        failed = [datetime.fromisoformat(line.split()[3].rstrip("Z")) for line in log.splitlines()
                  if "BACKOFF (could not start the worker" in line]  # fmt: skip
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(failed)]
        assert gaps, log[-2000:]
        assert min(gaps) >= 0.05, gaps  # each after a backoff, none at once within the last


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("method", [StartMethod.EXEC, StartMethod.FORK])
def test_a_spawn_out_of_descriptors_at_its_output_pipe_leaves_none_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: StartMethod
) -> None:
    """The heartbeat cell's memfd and the channel stayed open when the output pipe failed:
    a descriptor lost for good at each such failure, until serve could start no worker."""

    def out_of_descriptors(flags: int) -> tuple[int, int]:
        raise OSError(errno.EMFILE, "Too many open files")

    spec = WorkerSpec(home=str(tmp_path), session="s1", capture_output=True, start_method=method)
    before = _open_fds()
    monkeypatch.setattr(os, "pipe2", out_of_descriptors)
    with pytest.raises(OSError, match="Too many open files"):
        WorkerProcess(spec)
    assert _open_fds() == before


def test_a_spawn_out_of_descriptors_at_its_pidfd_ends_the_worker_and_keeps_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def out_of_descriptors(pid: int, flags: int = 0) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    spec = WorkerSpec(home=str(tmp_path), session="s1", capture_output=True,
                      start_method=StartMethod.EXEC)  # fmt: skip
    before = _open_fds()
    children = {p.pid for p in psutil.Process().children()}
    monkeypatch.setattr(os, "pidfd_open", out_of_descriptors)
    with pytest.raises(OSError, match="Too many open files"):
        WorkerProcess(spec)
    assert _open_fds() == before
    # The exec'd worker was killed and reaped: no child of ours is left.
    assert {p.pid for p in psutil.Process().children()} <= children
