"""The HTTP port: its own thread and asyncio loop, connections kept alive within bounds.

The daemon's loop is not this one: the server talks to the daemon only as a client
(``calls.ClientPool``), so nothing here can stall the daemon, and nothing of the daemon
is touched from this thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import sys
from collections.abc import Callable
from typing import Final

from supervisor.errors import ServeError
from supervisor.http.calls import ClientPool
from supervisor.http.parser import (
    KEEP_ALIVE_IDLE,
    MAX_HEAD,
    HttpError,
    read_request,
)
from supervisor.http.responses import error_response
from supervisor.http.routes import Api
from supervisor.http.tokens import TokenTable
from supervisor.loop_thread import LoopThread, cancel_the_rest

MAX_CONNECTIONS: Final = 2048
"""Connections at once; one more is answered 503 and closed. Each holds at most its
reader's buffer (twice ``MAX_HEAD``) and its transport's (64 KiB, then it is drained):
about 160 MiB for all of them."""
MAX_REQUESTS_PER_CONNECTION: Final = 1000
LINGER: Final = 2.0
"""Seconds an answered refusal waits for the peer's unread bytes (at most
``LINGER_BYTES``) before closing: closing with unread input sends a reset, which can
destroy the refusal before the peer reads it."""
LINGER_BYTES: Final = 4 << 20
BACKLOG: Final = 128


class HttpServer:
    """``loopd serve --http HOST:PORT``: bound at ``bind``, listening from ``listen`` (once
    the daemon's control socket listens), stopped at ``close``."""

    def __init__(self, address: str, home: str, tokens: TokenTable | None = None) -> None:
        self.address = address
        self.tokens = tokens  # loopd.toml's [tenants]; None: no token asked
        self.host, self.port = parse_address(address)
        self.pool = ClientPool(home)
        self.connections = 0
        self._sock: socket.socket | None = None
        self._thread = LoopThread("loopd-http", self._serve)

    def bind(self) -> None:
        """Take the port (ServeError in one line if it cannot be had), not listening yet.

        A bound socket that does not listen refuses connections (ECONNREFUSED), so a
        client waiting for the port is not let in before ``listen``: every call it made
        before the daemon's control socket listened would be answered ``503 no_daemon``.
        """
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # as create_server's
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise ServeError(f"--http {self.address}: {exc.strerror or exc}") from exc
        self._sock = sock
        self.port = sock.getsockname()[1]

    def listen(self) -> None:
        """Listen on the bound port and serve it on its own thread (ServeError if not)."""
        assert self._sock is not None, "bind() first"
        try:
            self._sock.listen(BACKLOG)
        except OSError as exc:
            raise ServeError(f"--http {self.address}: {exc.strerror or exc}") from exc
        self._sock.setblocking(False)
        _enough_descriptors()
        self._thread.start()
        print(f"loopd serve: http at {self.host}:{self.port}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Stop accepting (or close the port never listened on), end every connection,
        join the thread."""
        if self._thread.started:
            self._thread.stop()
        elif self._sock is not None:  # bound, never served: the loop did not take it
            self._sock.close()
        self.pool.close()

    async def _serve(self, ready: Callable[[], None], stopped: asyncio.Event) -> None:
        assert self._sock is not None
        api = Api(self.pool, self.tokens)
        server = await asyncio.start_server(  # which listens again: with our backlog
            lambda r, w: self._connection(api, r, w), sock=self._sock, limit=MAX_HEAD,
            backlog=BACKLOG,
        )  # fmt: skip
        ready()
        try:
            await stopped.wait()
        finally:
            server.close()
            await cancel_the_rest()
            api.links.close()
            await asyncio.sleep(0)  # the links' connection_lost: each closes its socket

    async def _connection(
        self, api: Api, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.connections += 1
        try:
            if self.connections > MAX_CONNECTIONS:
                writer.write(error_response(503, "busy", "too many connections", keep_alive=False))
                await _linger(reader, writer)
                return
            await self._requests(api, reader, writer)
        except (ConnectionError, TimeoutError):
            pass  # the peer went away or stalled: its connection ends here
        finally:
            self.connections -= 1
            writer.transport.abort()

    async def _requests(
        self, api: Api, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        # Deadlines are asyncio.timeout scopes, not wait_for: wait_for wraps each read in
        # a task of its own, a few more turns of the loop for every request.
        for _ in range(MAX_REQUESTS_PER_CONNECTION):
            try:
                async with asyncio.timeout(KEEP_ALIVE_IDLE):
                    first = await reader.read(1)
            except TimeoutError:
                return  # no request began: closed without a word
            if not first:
                return
            try:
                request = await read_request(reader, first)  # its deadlines are its own
            except HttpError as exc:
                writer.write(error_response(exc.status, exc.code, exc.message, keep_alive=False))
                await _linger(reader, writer)
                return
            keep = await api.answer(request, writer)
            await writer.drain()
            if not keep:
                return


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Send what was written, end our side, and read the peer's rest for a moment."""
    await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()
    taken = 0
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(LINGER):
            while taken < LINGER_BYTES and (data := await reader.read(1 << 16)):
                taken += len(data)


def parse_address(address: str) -> tuple[str, int]:
    """HOST:PORT (``[::1]:PORT`` for IPv6); ServeError in one line if not."""
    host, colon, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not host or not port.isdigit() or int(port) > 65535:
        raise ServeError(f"--http {address}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    return host, int(port)


def bind_http(
    address: str | None, home: str, tokens: TokenTable | None = None
) -> HttpServer | None:
    """The HTTP port, bound and not listening (``listen`` opens it), or None without
    ``--http``; with ``tokens``, every request bears one of them (docs/http.md)."""
    if address is None:
        return None
    server = HttpServer(address, home, tokens)
    server.bind()
    return server


def _enough_descriptors() -> None:
    """Raise the soft limit on open files to what ``MAX_CONNECTIONS`` need, within the
    hard limit (a systemd service's soft limit is 1,024 by default): past it, accepting
    fails for want of a descriptor instead of the 503 a client can read."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = MAX_CONNECTIONS + 1024  # the daemon's own: its sessions' channels, logs
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
