"""A control call to a socket whose accept backlog is full waits for it until its
deadline and never says the daemon is not running: a real listening Unix socket that
does not accept, its backlog filled by non-blocking connects."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from supervisor.client import call
from supervisor.control_socket import SOCKET_NAME
from supervisor.errors import ControlError

WAIT = 1.0


@contextlib.contextmanager
def _full_backlog(home: Path) -> Iterator[socket.socket]:
    """A socket at ``home/loopd.sock`` listening with a backlog of 1, never accepting,
    filled until a non-blocking connect gets EAGAIN."""
    home.mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fillers: list[socket.socket] = []
    try:
        listener.bind(str(home / SOCKET_NAME))
        listener.listen(1)
        for _ in range(16):
            filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            fillers.append(filler)
            filler.setblocking(False)
            try:
                filler.connect(str(home / SOCKET_NAME))
            except BlockingIOError:
                break
        else:
            raise AssertionError("the backlog never filled")
        yield listener
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


def test_a_call_to_a_full_backlog_times_out_busy_not_no_daemon(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with _full_backlog(home):
        started = time.monotonic()
        with pytest.raises(ControlError, match="overloaded") as failed:
            call(str(home), "ping", timeout=WAIT)
        waited = time.monotonic() - started
    assert failed.value.code == "busy"
    assert "running?" not in str(failed.value)
    assert WAIT <= waited < WAIT + 2.0


def test_a_call_to_a_full_backlog_succeeds_once_the_server_accepts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with _full_backlog(home) as listener:
        answered: list[object] = []

        def serve_late() -> None:
            """From 0.3 s on, accept everything; answer the connection that asks."""
            time.sleep(0.3)  # the call is meanwhile waiting for the backlog
            listener.settimeout(5)
            for _ in range(32):
                try:
                    conn, _addr = listener.accept()
                except TimeoutError:
                    return  # nobody asked: the call failed, as the test then says
                with conn:
                    conn.settimeout(0.2)
                    try:
                        request = conn.recv(1 << 16)
                    except TimeoutError:
                        continue  # a filler: it never asks anything
                    answered.append(msgpack.unpackb(request))
                    conn.sendall(msgpack.packb({"id": 1, "ok": True, "result": "pong"}))
                    return

        server = threading.Thread(target=serve_late)
        server.start()
        try:
            assert call(str(home), "ping", timeout=10) == "pong"
        finally:
            server.join(timeout=20)
        assert not server.is_alive()
        assert answered == [{"id": 1, "op": "ping"}]


def test_a_call_to_a_socket_nobody_listens_on_is_no_daemon_at_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        bound.bind(str(home / SOCKET_NAME))  # bound, never listening: ECONNREFUSED
        started = time.monotonic()
        with pytest.raises(ControlError, match="running") as failed:
            call(str(home), "ping", timeout=10)
        assert time.monotonic() - started < 1.0
    finally:
        bound.close()
    assert failed.value.code == "no_daemon"
