"""Idle or slow connections to the metrics port cannot deny an authorized scrape (issue 29,
item 4): real serve, real TCP connections, a real token file."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from supervisor.hosting.metrics.metrics_http import MAX_CONNECTIONS
from tests.harness.support import poll_until, running_daemon

TOKEN = "s3cret-token"  # noqa: S105 - the test's own token file
IDLE = MAX_CONNECTIONS + 4
"""Connections that send nothing: more than every scrape slot."""
TRICKLING = 4
"""Connections that send a request head one byte at a time, never finishing it."""
TRICKLE = b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * 4000
SCRAPES = 10
HEAD_DEADLINE = 2.0
"""Seconds from the accept to a whole request head (docs/operations.md, "Metrics")."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _accepted(pid: int, port: int) -> int:
    """Connections the daemon holds on ``port`` (accepted and not closed by it)."""
    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return 0
    return sum(
        1
        for c in connections
        if c.laddr and c.laddr.port == port and c.raddr and c.status == psutil.CONN_ESTABLISHED
    )


def _scrape(port: int, token: str | None = TOKEN) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=20) as answer:  # noqa: S310 - http only
        assert answer.status == 200
        return str(answer.read().decode())


class Holders:
    """Connections that hold scrape slots: idle ones, and ones trickling a head that never
    ends; each one the daemon closes is opened again, as a hostile local user would."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.done = threading.Event()
        self.idle: list[socket.socket] = [self._open() for _ in range(IDLE)]
        self.trickling: list[tuple[socket.socket, int]] = [
            (self._open(), 0) for _ in range(TRICKLING)
        ]
        self.thread = threading.Thread(target=self._hold, daemon=True)

    def _open(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        sock.setblocking(False)
        return sock

    def _closed_by_daemon(self, sock: socket.socket) -> bool:
        try:
            return sock.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True  # reset

    def _renewed(self, sock: socket.socket) -> socket.socket:
        if not self._closed_by_daemon(sock):
            return sock
        sock.close()
        return self._open()

    def _hold(self) -> None:
        next_byte = time.monotonic()
        while not self.done.wait(0.02):  # paces the holders; nothing waits on a condition
            self.idle = [self._renewed(sock) for sock in self.idle]
            trickle_now = time.monotonic() >= next_byte
            if trickle_now:
                next_byte += 0.3
            held = []
            for sock, sent_before in self.trickling:
                renewed = self._renewed(sock)
                sent = sent_before if renewed is sock else 0
                if trickle_now and sent < len(TRICKLE):
                    with contextlib.suppress(OSError):
                        sent += renewed.send(TRICKLE[sent : sent + 1])
                held.append((renewed, sent))
            self.trickling = held

    def __enter__(self) -> Holders:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.done.set()
        self.thread.join(timeout=30)
        for sock in [*self.idle, *(sock for sock, _sent in self.trickling)]:
            sock.close()


def test_idle_and_trickling_connections_leave_every_authorized_scrape_answered(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    port = _free_port()
    args = ("--metrics-listen", f"127.0.0.1:{port}", "--metrics-token-file", str(token_file))
    with running_daemon(home, *args) as daemon, Holders(port) as holders:
        poll_until(
            lambda: _accepted(daemon.proc.pid, port) >= MAX_CONNECTIONS,
            what="the holders to take every scrape slot",
        )
        answered = []
        for _ in range(SCRAPES):
            try:
                answered.append(_scrape(port))
            except OSError as exc:  # reset at its accept, or closed before the answer
                raise AssertionError(
                    f"scrape {len(answered) + 1} of {SCRAPES} failed: {exc!r}"
                ) from exc
        assert all("loopd_sessions" in text for text in answered)
        assert holders.thread.is_alive()


def _closed_by_daemon_within(sock: socket.socket, limit: float, *, trickle: bool) -> float:
    """Seconds until the daemon closes ``sock`` (at most ``limit``); a trickling one sends a
    byte of an unending request head every 0.3 s meanwhile."""
    started = time.monotonic()
    sent = 0
    while True:
        left = started + limit - time.monotonic()
        assert left > 0, f"the connection was still open after {limit} s"
        sock.settimeout(min(0.3, left))
        try:
            if trickle:
                sock.sendall(TRICKLE[sent : sent + 1])
                sent += 1
            if sock.recv(1) == b"":
                break
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            break  # reset by the daemon, seen by the recv or by the next byte sent
    return time.monotonic() - started


@pytest.mark.parametrize("trickle", [False, True], ids=["silent", "trickling"])
def test_a_connection_without_a_whole_request_head_is_closed_at_the_head_deadline(
    tmp_path: Path, trickle: bool
) -> None:
    port = _free_port()
    with running_daemon(tmp_path / "home", "--metrics-listen", f"127.0.0.1:{port}"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            # The deadline counts from the accept, however the head trickles in; a loaded
            # machine's loop may fire it late, never early. The accept itself may come up
            # to a second after the connect (TCP_DEFER_ACCEPT waits for a first byte).
            took = _closed_by_daemon_within(sock, HEAD_DEADLINE + 6.0, trickle=trickle)
        assert took >= HEAD_DEADLINE - 0.5, took
        assert "loopd_sessions" in _scrape(port, token=None)
