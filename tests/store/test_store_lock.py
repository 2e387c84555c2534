"""The session lock: one writer at a time, across processes, released by death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from worker import Baseline, Session, SessionLocked

HOLDER = """
import sys
from worker import Session
session = Session.open(sys.argv[1], "s1")
print("holding", flush=True)
sys.stdin.read()
"""


def test_a_second_opener_in_another_process_gets_session_locked_until_the_holder_is_killed(
    home: Path, baseline: Baseline
) -> None:
    Session.create(home, "s1", baseline).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(home)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"holding\n"
        with pytest.raises(SessionLocked, match=f"locked by process {holder.pid}") as caught:
            Session.open(home, "s1")
        assert caught.value.pid == holder.pid
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        for stream in (holder.stdin, holder.stdout):
            if stream is not None:
                stream.close()
    # The holder is dead and reaped: the kernel dropped the lock with its last fd.
    with Session.open(home, "s1") as session:
        assert session.id == "s1"


def test_a_second_opener_in_the_same_process_gets_session_locked(
    home: Path, baseline: Baseline
) -> None:
    with Session.create(home, "s1", baseline), pytest.raises(SessionLocked):
        Session.open(home, "s1")
    Session.open(home, "s1").close()
