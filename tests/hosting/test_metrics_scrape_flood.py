"""A flood of unauthenticated connections to the metrics port does not reset an
authorized scrape: real serve, real TCP connections from four threads (held, closed at
once, trickling, half-closed, never reading), a real token file."""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from pathlib import Path

import psutil

from tests.harness.support import poll_until, running_daemon

TOKEN = "s3cret-token"  # noqa: S105 - the test's own token file
ATTACKERS = 4
HELD_EACH = 48
"""Connections each attacker keeps open at once (the oldest is closed for a new one)."""
SCRAPES = 20
INTERVAL = 0.2
SCRAPE_WITHIN = 10.0
RSS_GROWTH_BOUND = 32 << 20
PARTIAL = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
UNAUTHORIZED = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
MODES = ("hold", "close", "slowloris", "half-close", "never-read")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Flood:
    """Threads that connect to ``port`` as fast as they can until stopped, each cycling
    through ``MODES``; every socket they open is closed by the time ``stop`` returns."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stopping = threading.Event()
        self.connects = 0
        self.threads = [threading.Thread(target=self._run, args=(n,)) for n in range(ATTACKERS)]

    def _run(self, first: int) -> None:
        held: list[socket.socket] = []
        try:
            for mode in itertools.islice(itertools.cycle(MODES), first, None):
                if self.stopping.is_set():
                    return
                sock = socket.socket()
                held.append(sock)
                sock.settimeout(1.0)
                with contextlib.suppress(OSError):
                    sock.connect(("127.0.0.1", self.port))
                    self.connects += 1
                    if mode == "close":
                        sock.close()
                    elif mode == "slowloris":
                        sock.send(PARTIAL)
                    elif mode == "half-close":
                        sock.send(PARTIAL)
                        sock.shutdown(socket.SHUT_WR)
                    elif mode == "never-read":
                        sock.send(UNAUTHORIZED)
                if len(held) > HELD_EACH:
                    held.pop(0).close()
        finally:
            for sock in held:
                sock.close()

    def __enter__(self) -> Flood:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in self.threads)


def _scrape(port: int) -> bytes:
    """One authorized scrape on a raw socket: the whole answer, or OSError."""
    with socket.create_connection(("127.0.0.1", port), timeout=SCRAPE_WITHIN) as sock:
        sock.sendall(
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + TOKEN.encode()
            + b"\r\n\r\n"
        )
        answer = b""
        while chunk := sock.recv(1 << 16):
            answer += chunk
    return answer


def test_an_unauthenticated_connect_flood_resets_no_authorized_scrape(tmp_path: Path) -> None:
    home = tmp_path / "home"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    port = _free_port()
    args = ("--metrics-listen", f"127.0.0.1:{port}", "--metrics-token-file", str(token_file))
    with running_daemon(home, *args) as daemon:
        serve = psutil.Process(daemon.proc.pid)
        before = int(serve.memory_info().rss)
        peak = before
        failures: list[str] = []
        answered = 0
        with Flood(port) as flood:
            poll_until(lambda: flood.connects >= 200, timeout=30, what="the flood to start")
            for n in range(SCRAPES):
                time.sleep(INTERVAL)  # the scrape interval, not a wait for a condition
                try:
                    answer = _scrape(port)
                except OSError as exc:
                    failures.append(f"scrape {n + 1}: {exc!r}")
                    continue
                if answer.startswith(b"HTTP/1.1 200 OK") and b"loopd_sessions" in answer:
                    answered += 1
                else:
                    failures.append(f"scrape {n + 1}: {answer[:80]!r}")
                peak = max(peak, int(serve.memory_info().rss))
        assert answered == SCRAPES, failures
        assert flood.connects > 400, "the flood was too thin to mean anything"
        assert peak - before < RSS_GROWTH_BOUND, f"grew by {(peak - before) >> 20} MiB"
        assert daemon.proc.poll() is None
