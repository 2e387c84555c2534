"""A pytest run leaves nothing running, even when a test fails or times out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

from tests.harness.leftover_reaper import RUN_VARIABLE
from tests.harness.support import poll_until

ROOT = Path(__file__).resolve().parents[2]
INNER = '''
import os, subprocess, sys, time
from pathlib import Path

import pytest

# The middle process starts a sleeper in a new session and exits: the sleeper is
# re-parented away from the runner, out of reach of any descendant walk.
DETACH = """
import os, subprocess, sys
sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                           start_new_session=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
print(sleeper.pid)
"""


def detach(name):
    out = subprocess.run([sys.executable, "-c", DETACH], capture_output=True, text=True,
                         check=True, start_new_session=True)
    Path(name).write_text(out.stdout.strip())


def test_fails_after_detaching_a_sleeper():
    detach("failed.pid")
    assert False


@pytest.mark.timeout(2)
def test_times_out_after_detaching_a_sleeper():
    detach("timed-out.pid")
    time.sleep(60)
'''


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_run_kills_the_processes_its_failed_and_timed_out_tests_detached(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {k: v for k, v in os.environ.items() if k != RUN_VARIABLE}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-p", "tests.harness.leftover_reaper", "test_inner.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    pids = [int((tmp_path / name).read_text()) for name in ("failed.pid", "timed-out.pid")]
    try:
        assert done.returncode == 1, done.stdout + done.stderr
        assert "2 failed" in done.stdout
        assert "killed 2 process(es) the run left running" in done.stdout
        poll_until(lambda: not any(_running(pid) for pid in pids), timeout=10, what="no sleeper")
    finally:
        for pid in pids:
            if _running(pid):
                psutil.Process(pid).kill()
