"""A ``loopd serve`` for a benchmark: started on a home, answering pings, always reaped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from supervisor.client import call
from supervisor.control_socket import SOCKET_NAME
from supervisor.errors import ControlError


def start_serve(home: str, *args: str, tree: str | None = None) -> subprocess.Popen[bytes]:
    """``loopd serve --home home *args`` with budgets no benchmark reaches, once it answers;
    with ``tree``, the loopd of that source tree (another commit's, to compare with)."""
    env = None if tree is None else {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "serve", "--home", home, "--budget",
         "1000000000", "--max-restarts", "1000", "--start-retries", "1000", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tree,
        start_new_session=True,  # a ^C reaches the script, which stops the daemon itself
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if os.path.exists(os.path.join(home, SOCKET_NAME)) and _pings(home):
                return proc
            time.sleep(0.01)
        raise RuntimeError("the daemon did not start")
    except BaseException:  # not started, or ^C while waiting: never leave it running
        stop_serve(proc)
        raise


def _pings(home: str) -> bool:
    try:
        call(home, "ping", timeout=5)
    except ControlError:
        return False
    return True


def stop_serve(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the daemon stops its workers), SIGKILL after 60 s; always reaped."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
