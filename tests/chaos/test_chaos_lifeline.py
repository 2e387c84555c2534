"""A `loopd chaos run` SIGKILLed mid-run (a CI timeout) leaves no process behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil

from tests.harness.support import poll_until

MARK = "LOOPD_TEST_LIFELINE"


def _marked(mark: str) -> list[int]:
    """Every live process whose environment carries ``MARK=mark`` (all the rig started)."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if needle in environ.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue  # gone meanwhile, or a kernel thread
    return [pid for pid in found if _alive(pid)]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _pool_at_work(rig: subprocess.Popen[bytes]) -> bool:
    assert rig.poll() is None, "the rig ended before its pool was seen"
    children = psutil.Process(rig.pid).children()
    return len(children) >= 2 and any(c.children() for c in children)


def test_a_chaos_run_killed_with_sigkill_leaves_none_of_its_processes_running(
    tmp_path: Path,
) -> None:
    mark = uuid.uuid4().hex
    env = {**os.environ, MARK: mark}
    rig = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "chaos", "run", "--budget", "60", "--jobs", "2",
         "--seed", "1", "--dir", str(tmp_path)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        # Mid-run: the pool's two processes are up and at least one of them has forked a
        # case of its own (a grandchild of the rig), seen marked in one look: the rig, its
        # two pool processes, a case (a case lasts milliseconds: two looks may miss it).
        poll_until(lambda: _pool_at_work(rig) and len(_marked(mark)) >= 4, timeout=60,
                   what="the rig's pool and a case, all four marked")  # fmt: skip
        rig.send_signal(signal.SIGKILL)
        rig.wait(timeout=30)
        poll_until(lambda: _marked(mark) == [], timeout=30,
                   what="every process of the rig to end after its SIGKILL")  # fmt: skip
    finally:
        for pid in _marked(mark):  # nothing left behind, even when the check failed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if rig.poll() is None:
            rig.kill()
            rig.wait()
