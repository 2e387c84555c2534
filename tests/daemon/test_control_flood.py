"""Clients that pipeline many costly requests neither hold the daemon's loop nor get work
done for them after they are gone (issue 29, item 3): real serve, real Unix socket."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import msgpack
import psutil

from supervisor.client import call
from supervisor.control_socket import SOCKET_NAME
from tests.harness.support import poll_until, running_daemon
from worker.ipc.wire import Message

SESSIONS = 16
"""Running sessions, so that each ``status`` reads 16 workers' /proc entries (some ms)."""
FLOOD_CONNECTIONS = 200
FRAMES_EACH = 50
ANSWERED_WITHIN = 10.0
"""Generous for a loaded machine; the loop held by the flood made it about a minute."""
FLOOD_CPU_BOUND = 8.0
"""Seconds of the daemon's CPU the flood may cost: requests started before their client
hung up, and the connections themselves (answering every request was some 25 s)."""


def _status_frames(count: int) -> bytes:
    return b"".join(msgpack.packb({"id": n, "op": "status"}) for n in range(count))


def _connect(home: Path, deadline: float) -> socket.socket:
    """A connection to the daemon; a full accept backlog (EAGAIN) is waited out, since its
    wait is part of how long the daemon takes to answer."""

    def attempt() -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(str(home / SOCKET_NAME))
        except BlockingIOError:
            sock.close()
            return None
        return sock

    sock = poll_until(attempt, timeout=deadline - time.monotonic(), what="a connection")
    sock.setblocking(True)
    return sock


def _read_reply(sock: socket.socket, deadline: float) -> Message:
    unpacker = msgpack.Unpacker(raw=False)
    while True:
        for reply in unpacker:
            assert isinstance(reply, dict)
            return reply
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        data = sock.recv(1 << 16)
        assert data, "the daemon closed the connection without a reply"
        unpacker.feed(data)


def _round_trip(home: Path, request: Message, within: float) -> float:
    """Seconds from connecting to the reply of ``request`` (an ok one), at most ``within``."""
    started = time.monotonic()
    deadline = started + within
    sock = _connect(home, deadline)
    try:
        sock.sendall(msgpack.packb(request))
        try:
            reply = _read_reply(sock, deadline)
        except TimeoutError:
            raise AssertionError(
                f"{request['op']} not answered within {within} s while the flood ran"
            ) from None
    finally:
        sock.close()
    assert reply.get("ok") is True, reply
    return time.monotonic() - started


def _clients(home: Path) -> int:
    status = call(str(home), "ping", timeout=30)
    assert isinstance(status, dict)
    clients = status["clients"]
    assert isinstance(clients, int)
    return clients


def _serving(home: Path, daemon_alive: bool) -> None:
    """Serve is healthy: alive, answering, every session RUNNING, no flood connection left."""
    assert daemon_alive
    poll_until(lambda: _clients(home) == 1, timeout=30, what="the flood's connections to end")
    rows = call(str(home), "status", timeout=30)
    assert isinstance(rows, list)
    assert {row["state"] for row in rows} == {"RUNNING"}, rows


def test_connections_that_pipeline_status_and_hang_up_leave_ping_and_create_answered(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home) as daemon:
        for n in range(SESSIONS):
            call(str(home), "create", session=f"s{n}", timeout=60)
        frames = _status_frames(FRAMES_EACH)
        sent = 0
        failed: list[OSError] = []

        def flood() -> None:
            nonlocal sent
            try:
                for _ in range(FLOOD_CONNECTIONS):
                    # Blocking (no timeout): connect waits while the accept backlog is full.
                    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                        sock.connect(str(home / SOCKET_NAME))
                        sock.sendall(frames)  # and hang up at once, not reading a reply
                    sent += 1
            except OSError as exc:
                failed.append(exc)

        serve = psutil.Process(daemon.proc.pid)
        cpu_before = sum(serve.cpu_times()[:2])
        flooder = threading.Thread(target=flood, daemon=True)
        flooder.start()
        try:
            poll_until(
                lambda: sent >= FLOOD_CONNECTIONS // 2 or failed, timeout=60, what="the flood"
            )
            _round_trip(home, {"id": 1, "op": "ping"}, ANSWERED_WITHIN)
            _round_trip(home, {"id": 2, "op": "create", "session": "late"}, ANSWERED_WITHIN)
            _round_trip(home, {"id": 3, "op": "ping"}, ANSWERED_WITHIN)
        finally:
            flooder.join(timeout=100)
        assert not flooder.is_alive()
        assert not failed, failed
        _serving(home, daemon.proc.poll() is None)
        # Answering all 10,000 for nobody took the daemon some 25 s of CPU on a 2-core VM.
        flood_cpu = sum(serve.cpu_times()[:2]) - cpu_before
        assert flood_cpu < FLOOD_CPU_BOUND, f"{flood_cpu:.1f} s of CPU on hung-up connections"


LIVE_CONNECTIONS = 50
LIVE_FRAMES_EACH = 200


def test_connections_that_pipeline_status_and_stay_get_answers_without_holding_the_loop(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home) as daemon:
        for n in range(SESSIONS):
            call(str(home), "create", session=f"s{n}", timeout=60)
        frames = _status_frames(LIVE_FRAMES_EACH)
        live: list[socket.socket] = []
        try:
            for _ in range(LIVE_CONNECTIONS):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                live.append(sock)
                sock.settimeout(60)
                sock.connect(str(home / SOCKET_NAME))
                sock.sendall(frames)
            _round_trip(home, {"id": 1, "op": "ping"}, ANSWERED_WITHIN)
            _round_trip(home, {"id": 2, "op": "create", "session": "late"}, ANSWERED_WITHIN)
            # Each connection still there is being answered, in order.
            deadline = time.monotonic() + 60
            for sock in live:
                first = _read_reply(sock, deadline)
                assert first["id"] == 0, first
                assert first["ok"] is True, first
        finally:
            for sock in live:
                with contextlib.suppress(OSError):
                    sock.close()
        # What the closed connections still asked for is dropped: the daemon is free again.
        _round_trip(home, {"id": 3, "op": "ping"}, ANSWERED_WITHIN)
        _serving(home, daemon.proc.poll() is None)
