"""``tests.harness.support.stop``: once it returns, the process answers nothing.

A SIGSTOP is not in effect when ``kill`` returns (one thread is woken to take it; the
others stop once it has run), so a test that sends a request right after the signal can
be answered by the process it meant to have stopped. ``stop`` waits until every thread
is stopped: a thread echoing on a socket, its request sent right after, never echoes.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest

from chaos.proc_states import thread_states
from tests.harness.support import REPO, stop, stopped

pytestmark = pytest.mark.timeout(60)


def _echoing() -> tuple[subprocess.Popen[bytes], socket.socket]:
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.programs.echo_process", str(theirs.fileno())],
        pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, cwd=REPO,
    )  # fmt: skip
    theirs.close()
    ours.settimeout(20)
    ours.sendall(b"a")
    assert ours.recv(1) == b"a"  # its thread is in recv() now
    return proc, ours


def test_a_process_stopped_by_stop_answers_nothing_until_continued() -> None:
    for _ in range(8):
        proc, sock = _echoing()
        try:
            stop(proc)
            assert set(thread_states(proc.pid).values()) == {"T"}
            sock.sendall(b"b")
            sock.settimeout(0.2)
            with pytest.raises(TimeoutError):
                sock.recv(1)
            proc.send_signal(signal.SIGCONT)
            sock.settimeout(20)
            assert sock.recv(1) == b"b"  # answered once continued
        finally:
            proc.kill()
            proc.wait()
            sock.close()


def test_stopped_fails_when_something_resumed_the_process_in_the_block() -> None:
    proc, sock = _echoing()

    def resumed_in_the_block() -> None:
        with stopped(proc):
            proc.send_signal(signal.SIGCONT)  # someone else's SIGCONT
            sock.sendall(b"c")
            assert sock.recv(1) == b"c"  # it answers again

    try:
        with pytest.raises(AssertionError, match="resumed while the test ran"):
            resumed_in_the_block()
    finally:
        proc.kill()
        proc.wait()
        sock.close()
