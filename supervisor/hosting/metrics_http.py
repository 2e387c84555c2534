"""``serve --metrics-listen HOST:PORT``: the exposition over HTTP, from the daemon's loop.

One asyncio protocol per connection, no threads: it reads one request head (at most
``MAX_HEAD`` bytes, for ``HEAD_TIMEOUT`` seconds), answers ``GET /metrics`` with the
exposition (anything else with 404 or 405) and closes the connection (HTTP/1.0 style),
so a scraper can never hold a connection or a buffer for long.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from supervisor.hosting.metrics import CONTENT_TYPE

MAX_HEAD: Final = 8192
HEAD_TIMEOUT: Final = 10.0


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 hosts in brackets) -> (host, port); ValueError with the reason."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r}: expected HOST:PORT, such as 127.0.0.1:9464")
    return host.strip("[]") or "127.0.0.1", int(port)


class MetricsProtocol(asyncio.Protocol):
    """Answers one HTTP request on a connection with the rendered exposition."""

    def __init__(self, render: Callable[[], str]) -> None:
        self.render = render
        self.transport: asyncio.Transport | None = None
        self.head = b""
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.timer = asyncio.get_running_loop().call_later(HEAD_TIMEOUT, transport.abort)

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.head += data
        if b"\r\n\r\n" not in self.head and b"\n\n" not in self.head:
            if len(self.head) > MAX_HEAD:
                self._answer(431, "Request Header Fields Too Large", b"")
            return
        request_line = self.head.split(b"\n", 1)[0].decode("latin-1").split()
        if len(request_line) < 2:
            self._answer(400, "Bad Request", b"")
        elif request_line[0] not in ("GET", "HEAD"):
            self._answer(405, "Method Not Allowed", b"")
        elif request_line[1].split("?", 1)[0] not in ("/metrics", "/"):
            self._answer(404, "Not Found", b"")
        else:
            body = self.render().encode()
            self._answer(200, "OK", b"" if request_line[0] == "HEAD" else body, len(body))

    def _answer(self, code: int, reason: str, body: bytes, length: int | None = None) -> None:
        assert self.transport is not None
        head = (
            f"HTTP/1.1 {code} {reason}\r\nContent-Type: {CONTENT_TYPE}\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\n"
            "Connection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self.transport.close()  # after the buffer is flushed

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.transport = None


async def serve_metrics(
    loop: asyncio.AbstractEventLoop, listen: str, render: Callable[[], str]
) -> asyncio.Server:
    """Listen on ``listen`` and answer scrapes with ``render()``."""
    host, port = parse_listen(listen)
    return await loop.create_server(lambda: MetricsProtocol(render), host, port)
