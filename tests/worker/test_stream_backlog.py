"""A client that asks for partials and never reads them costs the worker at most the
partial backlog bound (docs/operations.md, "Flow control and limits"), however the App
streams: one stream() call of 64 MB or hundreds of smaller ones (issue #29, item 5).

Every test runs a real ``loopd serve`` with an App of tests/apps/stream_backlog_apps.py, a
real connection to the worker that sends one streamed request and never reads, and
measures the worker's resident memory with psutil.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import psutil
import pytest

from supervisor.client import Client, call
from supervisor.client.control import exchange, open_control, result_of
from tests.harness.support import log_user_keys, poll_until, running_daemon, status, wait_state
from worker.ipc.wire import encode

HEADROOM = 25 << 20
"""Resident bytes the worker may hold above its idle figure while the client does not
read: the 4 MiB bound, one frame past it, and the allocator's slack."""


def _worker_connection(home: Path) -> socket.socket:
    """A connection straight to session s's worker, handed over by the daemon."""
    control = open_control(str(home), 30)
    try:
        frame = encode({"id": 1, "op": "connect", "session": "s"})
        replies, fds = exchange(control, frame, 1, time.monotonic() + 30)
    finally:
        control.close()
    result_of(replies[0])
    assert len(fds) == 1, fds
    return socket.socket(fileno=fds[0])


def _durable(home: Path, key: str) -> bool:
    try:
        return key in log_user_keys(home, "s")
    except ValueError:  # a line being written as it was read: look again
        return False


@pytest.mark.timeout(110)
@pytest.mark.parametrize("app", ["OneHugeStreamApp", "ManyStreamsApp"])
def test_64_mb_streamed_to_a_client_that_never_reads_keeps_the_worker_near_its_idle_memory(
    tmp_path: Path, app: str
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--app", f"tests.apps.stream_backlog_apps:{app}"):
        call(str(home), "create", session="s")
        wait_state(home, "s", "RUNNING")
        with Client(str(home), timeout=30) as client:
            warm = client.stream("s", "warm up", key="warm")
            assert list(warm) == ["small"]
        pid = status(home, "s")["pid"]
        assert isinstance(pid, int)
        worker = psutil.Process(pid)
        idle = worker.memory_info().rss
        silent = _worker_connection(home)
        try:
            request = {"text": "flood", "key": "flood", "stream": True}
            silent.sendall(encode({"id": 7, "op": "request", "request": request}))
            poll_until(lambda: _durable(home, "flood"), timeout=60, what="the flood's record")
            with Client(str(home), timeout=30) as other:
                after = other.send("s", "another client", key="after")
                again = other.send("s", "flood", key="flood")
            grown = worker.memory_info().rss - idle
        finally:
            silent.close()
        row = status(home, "s")
    assert after["text"] == "echo: another client"
    assert again["duplicate"] is True  # the flood was applied, its reply durable
    assert (row["pid"], row["restarts"]) == (pid, 0)
    assert grown < HEADROOM, f"the worker grew by {grown / 2**20:.1f} MiB"
    assert log_user_keys(home, "s") == ["warm", "flood", "after"]
