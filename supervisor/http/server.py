"""The HTTP port: its own thread and asyncio loop, connections kept alive within bounds
(each a ``connection.HttpConnection``).

The daemon's loop is not this one: the server talks to the daemon only as a client
(``calls.ClientPool``), so nothing here can stall the daemon, and nothing of the daemon
is touched from this thread.
"""

from __future__ import annotations

import asyncio
import resource
import socket
import sys
from collections.abc import Callable
from typing import Final

from supervisor.errors import ServeError
from supervisor.http.calls import ClientPool
from supervisor.http.connection import HttpConnection
from supervisor.http.limits import MAX_CONNECTIONS
from supervisor.http.routes import Api
from supervisor.http.tokens import TokenTable
from supervisor.loop_thread import LoopThread, cancel_the_rest

BACKLOG: Final = 128


class HttpServer:
    """``loopd serve --http HOST:PORT``: bound at ``bind``, listening from ``listen`` (once
    the daemon's control socket listens), stopped at ``close``."""

    def __init__(self, address: str, home: str, tokens: TokenTable | None = None) -> None:
        self.address = address
        self.tokens = tokens  # loopd.toml's [tenants]; None: no token asked
        self.host, self.port = parse_address(address)
        self.pool = ClientPool(home)
        self.open: set[HttpConnection] = set()  # the connections open (the loop's thread)
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
        loop = asyncio.get_running_loop()
        server = await loop.create_server(  # which listens again: with our backlog
            lambda: HttpConnection(api, self.open), sock=self._sock, backlog=BACKLOG
        )
        ready()
        try:
            await stopped.wait()
        finally:
            server.close()
            for connection in list(self.open):
                connection.abort()
            await cancel_the_rest()
            api.links.close()
            await asyncio.sleep(0)  # the links' connection_lost: each closes its socket


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
