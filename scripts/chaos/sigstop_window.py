"""How often a process answers a request sent right after its SIGSTOP.

    python -m scripts.chaos.sigstop_window [--trials N]

A child (``tests/programs/echo_process.py``) has one thread echoing each byte of a socket and its
main thread waiting for a signal. For each trial the parent sends SIGSTOP and then one
byte at once, and counts an echo within 0.2 s: a SIGSTOP is not in effect when ``kill``
returns (one thread is woken to take it; the others stop once it has run). The same
again with ``tests.harness.support.stop`` (SIGSTOP, then a wait until every thread is in state
T) before the byte: none should come back (docs/chaos.md, "In the test suite").
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys

from tests.harness.support import REPO, stop


def _trial(wait: bool) -> bool:
    """True if the byte sent after the SIGSTOP was echoed."""
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.programs.echo_process", str(theirs.fileno())],
        pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, cwd=REPO,
    )  # fmt: skip
    theirs.close()
    try:
        ours.settimeout(20)
        ours.sendall(b"a")
        assert ours.recv(1) == b"a"  # its thread is in recv() now
        if wait:
            stop(proc)
        else:
            proc.send_signal(signal.SIGSTOP)
        ours.sendall(b"b")
        ours.settimeout(0.2)
        try:
            return ours.recv(1) == b"b"
        except TimeoutError:
            return False
    finally:
        proc.kill()
        proc.wait()
        ours.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    args = parser.parse_args()
    for wait, what in ((False, "SIGSTOP alone"), (True, "SIGSTOP and the wait (stop)")):
        echoed = sum(_trial(wait) for _ in range(args.trials))
        print(f"{what}: {echoed} of {args.trials} bytes sent after it were echoed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
