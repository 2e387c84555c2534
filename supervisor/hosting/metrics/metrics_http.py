"""``serve --metrics-listen HOST:PORT``: the exposition over HTTP, from the daemon's loop.

One asyncio protocol per connection, no threads: it reads one request head (at most
``MAX_HEAD`` bytes, for ``HEAD_TIMEOUT`` seconds), answers ``GET /metrics`` with the
exposition (anything else with 404 or 405) and closes the connection (HTTP/1.0 style),
so a scraper can never hold a connection or a buffer for long.

Who may scrape: with ``--metrics-token-file`` a request must carry
``Authorization: Bearer <token>`` (Prometheus' ``authorization: credentials_file:``),
else it is answered 401; the token is compared in constant time. How many may connect:
at most ``MAX_CONNECTIONS`` at once, apart from the control socket's connections, so a
flood of idle connections holds a handful of descriptors and never the daemon's whole
table. Idle ones cannot hold those slots against a scraper either (issue 29: 16 idle
connections from any local uid once reset every scrape): a request head must be whole
within ``HEAD_TIMEOUT``, and a connection that finds every slot taken reclaims the slot
of the one that has waited longest without a whole head (it is reset), so a scraper,
whose head follows its connect at once, is answered. Before a connection is reset so,
what it has already sent is read (in an accept burst the loop accepts many connections
before it reads any): a scraper accepted just before a flood of connections has its
head whole in its socket's buffer, and is answered instead of reset. An answer that the
kernel took whole frees its slot at once. Only when every slot holds an answer still
being written is a new connection closed at its accept.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import os
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from supervisor.hosting.metrics.exposition import CONTENT_TYPE
from supervisor.hosting.regular_file import read_regular

MAX_HEAD: Final = 8192
HEAD_TIMEOUT: Final = 2.0
"""Seconds from the accept to a whole request head (a scraper sends it at once)."""
ANSWER_TIMEOUT: Final = 10.0
"""Seconds an answered connection may take to read its answer before it is reset."""
MAX_CONNECTIONS: Final = 16
"""Scrape connections open at once; a further one takes the slot of the longest waiting
for its head, or is closed at its accept if every slot holds an answer being written."""
MAX_TOKEN_BYTES: Final = 4096
DEFER_ACCEPT: Final = 1
"""Seconds a connection that has sent nothing waits in the kernel before its accept."""
_RESET: Final = frozenset({errno.ECONNRESET, errno.ETIMEDOUT, errno.EPIPE, errno.ENOTCONN})


class TokenError(ValueError):
    """The token file cannot be used; ``str()`` says which and why."""


def read_token(path: str) -> bytes:
    """The bearer token in ``path`` (surrounding whitespace removed); TokenError if the file
    is missing, not a regular file, readable by group or others, or empty."""
    try:
        raw = read_regular(path, MAX_TOKEN_BYTES)
        mode = os.stat(path, follow_symlinks=False).st_mode if raw is not None else 0
    except OSError as exc:
        raise TokenError(f"{path}: cannot read: {exc.strerror}") from exc
    if raw is None:
        raise TokenError(f"{path}: no such file")
    if stat.S_IMODE(mode) & 0o077:
        raise TokenError(f"{path}: mode {stat.S_IMODE(mode):04o} lets others read the token; "
                         "chmod 600 it")  # fmt: skip
    token = raw.strip()
    if not token or any(b < 0x21 or b > 0x7E for b in token):
        raise TokenError(f"{path}: the token must be one word of printable ASCII")
    return token


@dataclass(slots=True)
class ScrapeGate:
    """What every scrape connection shares: the token asked for, and the open slots."""

    token: bytes | None = None
    limit: int = MAX_CONNECTIONS
    open: int = 0
    refused: int = 0
    reclaimed: int = 0
    unauthorized: int = 0
    waiting: dict[MetricsProtocol, None] = field(default_factory=dict)
    """The open connections whose request head is not whole yet, oldest first."""

    def admit(self, conn: MetricsProtocol) -> bool:
        """Give ``conn`` a slot, reclaiming the one of the connection that has waited
        longest for its head if none is free; False (refused) if none can be reclaimed."""
        for candidate in list(self.waiting):
            if self.open < self.limit:
                break
            if candidate.read_ahead():  # its head is not whole even with what it sent
                self.reclaimed += 1
                candidate.evict()
        if self.open >= self.limit:
            return False
        self.open += 1
        self.waiting[conn] = None
        return True

    def release(self, conn: MetricsProtocol) -> None:
        """``conn``'s slot is free (it closed, or was evicted)."""
        self.waiting.pop(conn, None)
        self.open -= 1


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 hosts in brackets) -> (host, port); ValueError with the reason."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r}: expected HOST:PORT, such as 127.0.0.1:9464")
    return host.strip("[]") or "127.0.0.1", int(port)


class MetricsProtocol(asyncio.Protocol):
    """Answers one HTTP request on a connection with the rendered exposition."""

    def __init__(self, render: Callable[[], str], gate: ScrapeGate) -> None:
        self.render = render
        self.gate = gate
        self.transport: asyncio.Transport | None = None
        self.head = b""
        self.timer: asyncio.TimerHandle | None = None
        self.counted = False
        self.answered = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if not self.gate.admit(self):
            # No slot: answered (briefly over the limit) only if its whole head is here
            # already, as a scraper's is once the kernel has let it be accepted.
            if self.read_ahead():
                self.gate.refused += 1
                transport.abort()  # its descriptor is released now, not at a timeout
            return
        self.counted = True
        self.timer = asyncio.get_running_loop().call_later(HEAD_TIMEOUT, transport.abort)

    def read_ahead(self) -> bool:
        """Act on what the peer has sent and the loop has not read yet; True if this
        connection still waits for its head (False: answered, or gone)."""
        if self.transport is None or self.transport.is_closing():
            return False
        sock = self.transport.get_extra_info("socket")
        try:
            # os.read: the transport's socket object refuses recv; the descriptor is
            # non-blocking, and the transport's own next read finds nothing (EAGAIN).
            data = os.read(sock.fileno(), MAX_HEAD + 1)
        except BlockingIOError:
            return True  # nothing more sent: still waiting
        except OSError as exc:
            if exc.errno not in _RESET:
                raise
            data = b""
        if not data:
            self.evict()  # gone, or half-closed without a whole head: nothing to answer
            return False
        self.data_received(data)
        return not self.answered

    def evict(self) -> None:
        """Give up this connection's slot to a newer one: reset it now."""
        self._uncount()
        if self.transport is not None:
            self.transport.abort()  # connection_lost follows; the slot is free already

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.head += data
        if b"\r\n\r\n" not in self.head and b"\n\n" not in self.head:
            if len(self.head) > MAX_HEAD:
                self._answer(431, "Request Header Fields Too Large", b"")
            return
        self.gate.waiting.pop(self, None)  # whole: answered now, its slot no longer taken
        request_line = self.head.split(b"\n", 1)[0].decode("latin-1").split()
        if len(request_line) < 2:
            self._answer(400, "Bad Request", b"")
        elif request_line[0] not in ("GET", "HEAD"):
            self._answer(405, "Method Not Allowed", b"")
        elif request_line[1].split("?", 1)[0] not in ("/metrics", "/"):
            self._answer(404, "Not Found", b"")
        elif not self._authorized():
            self.gate.unauthorized += 1
            self._answer(401, "Unauthorized", b"", extra="WWW-Authenticate: Bearer\r\n")
        else:
            body = self.render().encode()
            self._answer(200, "OK", b"" if request_line[0] == "HEAD" else body, len(body))

    def _authorized(self) -> bool:
        wanted = self.gate.token
        if wanted is None:
            return True
        for line in self.head.split(b"\n")[1:]:
            name, sep, value = line.partition(b":")
            if sep and name.strip().lower() == b"authorization":
                scheme, _, given = value.strip().partition(b" ")
                if scheme.lower() == b"bearer":
                    return hmac.compare_digest(given.strip(), wanted)
        return False

    def _answer(
        self, code: int, reason: str, body: bytes, length: int | None = None, extra: str = ""
    ) -> None:
        assert self.transport is not None
        self.answered = True
        head = (
            f"HTTP/1.1 {code} {reason}\r\nContent-Type: {CONTENT_TYPE}\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\n{extra}"
            "Connection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self.transport.close()  # after the buffer is flushed
        self.gate.waiting.pop(self, None)  # answered: never reclaimed while it is written
        if self.timer is not None:
            self.timer.cancel()
        if not self.transport.get_write_buffer_size():
            self._uncount()  # the kernel took it all: the slot is free before the close
        else:
            self.timer = asyncio.get_running_loop().call_later(ANSWER_TIMEOUT, self.transport.abort)

    def _uncount(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.counted:
            self.counted = False
            self.gate.release(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._uncount()
        self.transport = None


async def serve_metrics(
    loop: asyncio.AbstractEventLoop,
    listen: str,
    render: Callable[[], str],
    gate: ScrapeGate | None = None,
) -> asyncio.Server:
    """Listen on ``listen`` and answer scrapes with ``render()``, as ``gate`` allows."""
    host, port = parse_listen(listen)
    gate = gate or ScrapeGate()
    server = await loop.create_server(lambda: MetricsProtocol(render, gate), host, port)
    for sock in server.sockets:
        # Linux: a connection is accepted once its first bytes arrived (or DEFER_ACCEPT
        # seconds passed), so a scraper's head is in its buffer when it is accepted.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, DEFER_ACCEPT)
    return server
