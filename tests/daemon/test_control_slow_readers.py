"""Control clients that pipeline requests and never read their replies hold a bounded
amount of the daemon's memory, and everyone else is served meanwhile: real serve, real
Unix socket, the daemon's RSS measured."""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path

import msgpack
import psutil
import pytest

from supervisor.client import call
from supervisor.client.control import exchange
from supervisor.control_socket import SOCKET_NAME
from supervisor.daemon.connection import MAX_CLIENTS
from supervisor.daemon.listener import TOO_MANY
from supervisor.errors import ControlError
from tests.harness.support import poll_until, running_daemon

SESSIONS = 40
SLOW_READERS = 200
"""Connections that pipeline and never read: under ``MAX_CLIENTS``, so each is served."""
FRAMES_EACH = 2000
RSS_GROWTH_BOUND = 64 << 20
"""Bytes the daemon may grow by while the slow readers are connected (docs/operations.md,
"Flow control and limits"): a 1 MiB high water per connection let it grow by some
380 MB with 200 of them."""
PING_WITHIN = 10.0


def _status_frames(count: int) -> bytes:
    return b"".join(msgpack.packb({"id": n, "op": "status"}) for n in range(count))


def _connect(home: Path) -> socket.socket:
    """A blocking connect: it waits while the daemon's accept backlog is full."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(home / SOCKET_NAME))
    except OSError:
        sock.close()
        raise
    sock.settimeout(30)
    return sock


def _rss(proc: psutil.Process) -> int:
    return int(proc.memory_info().rss)


def test_slow_readers_grow_the_daemon_by_a_bounded_amount_while_ping_is_answered(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--idle-stop", "1") as daemon:
        for n in range(SESSIONS):
            call(str(home), "create", session=f"s{n}", timeout=60)
        # Hibernated, a session's status row is cheap to make: the flood costs memory
        # quickly rather than CPU.
        poll_until(lambda: _all_idle(home), timeout=60, what="every session to hibernate")
        serve = psutil.Process(daemon.proc.pid)
        before = _rss(serve)
        frames = _status_frames(FRAMES_EACH)
        slow: list[socket.socket] = []
        try:
            for _ in range(SLOW_READERS):
                sock = _connect(home)
                slow.append(sock)
                sock.sendall(frames)  # never read: the replies back up in the daemon
            peak = before
            pings: list[float] = []
            # The daemon keeps answering what the kernel's buffers take, then stops: watch
            # its RSS over a few seconds of that, asking for a ping each time.
            ends = time.monotonic() + 4.0
            while time.monotonic() < ends:
                started = time.monotonic()
                call(str(home), "ping", timeout=PING_WITHIN)
                pings.append(time.monotonic() - started)
                peak = max(peak, _rss(serve))
            assert pings, "no ping was answered"
            assert max(pings) < PING_WITHIN
            grown = peak - before
            assert grown < RSS_GROWTH_BOUND, (
                f"the daemon grew by {grown >> 20} MiB for {SLOW_READERS} slow readers"
            )
        finally:
            for sock in slow:
                with contextlib.suppress(OSError):
                    sock.close()
        poll_until(
            lambda: _clients(home) == 1, timeout=60, what="the slow readers' connections to end"
        )


def _all_idle(home: Path) -> bool:
    rows = call(str(home), "status", timeout=30)
    assert isinstance(rows, list)
    return {row["state"] for row in rows} == {"IDLE"}


def _clients(home: Path) -> int | None:
    """The daemon's count of control clients (this ping's included); None while it
    refuses the ping as one too many (the previous ping's close not yet seen)."""
    try:
        status = call(str(home), "ping", timeout=30)
    except ControlError as exc:
        if exc.code != "busy":
            raise
        return None
    assert isinstance(status, dict)
    clients = status["clients"]
    assert isinstance(clients, int)
    return clients


def test_a_control_connection_over_the_limit_is_refused_busy_and_the_rest_served(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home) as daemon:
        held: list[socket.socket] = []
        try:
            for _ in range(MAX_CLIENTS - 1):  # and the ping below is the last one admitted
                held.append(_connect(home))
            poll_until(lambda: _clients(home) == MAX_CLIENTS, timeout=30, what="every hold")
            held.append(_connect(home))
            with pytest.raises(ControlError, match="too many control connections") as refused:
                call(str(home), "ping", timeout=10)
            assert refused.value.code == "busy"
        finally:
            for sock in held:
                with contextlib.suppress(OSError):
                    sock.close()
        poll_until(lambda: _clients(home) == 1, timeout=30, what="the held connections to end")
        assert daemon.proc.poll() is None


@pytest.mark.parametrize("size", [100, 1 << 20], ids=["one-send", "selector"])
def test_a_refusal_the_daemon_wrote_before_closing_is_the_error_even_when_the_send_meets_epipe(
    size: int,
) -> None:
    """The daemon answers a connection past its limit with ``busy`` and closes it without
    reading: a client whose request is sent after that close meets EPIPE, and must still
    report the refusal it holds, not a broken pipe (a CI run's flake of the test above)."""
    ours, daemons = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours:
        daemons.sendall(TOO_MANY)
        daemons.close()  # before a byte of the request: the send below meets EPIPE
        with pytest.raises(ControlError, match="too many control connections") as refused:
            exchange(ours, b"x" * size, 1, time.monotonic() + 10)
        assert refused.value.code == "busy"


def test_a_peer_that_closed_saying_nothing_is_still_a_closed_connection() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours:
        theirs.close()
        with pytest.raises(BrokenPipeError):
            exchange(ours, b"x" * 100, 1, time.monotonic() + 10)
