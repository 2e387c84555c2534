"""The floors' relays: a process in the middle that does only what no design can skip.

Each is a process of its own between a client and what makes a write durable, as a
loopd worker (or the HTTP port) is, doing nothing else: no frame decoded, no App, no
record encoded, no check. Its round trip is the least any process of that place can
cost, so a goal below it is out of reach whatever the process does (docs/benchmarks.md,
"Floors").

- ``file LOG SOCKET SIZE``: reads ``SIZE`` bytes from a unix connection, ``os.write`` +
  ``os.fdatasync`` to ``LOG``, answers one byte.
- ``postgres URI SOCKET SIZE``: the same, the bytes written by one transaction (BEGIN,
  the store's own prepared INSERT, COMMIT) in one round trip, as the PostgreSQL store
  writes a group (``worker.store.postgres.pipeline``).
- ``http HOME SESSION``: an asyncio loop on a thread of its own (as the HTTP port runs
  off serve's loop) listening on loopback TCP; each connection is relayed byte for byte
  to a direct connection to ``SESSION``'s worker (asked of the daemon as the port asks
  for one) and back. Nothing is parsed: the client writes the worker's own frames.

Each prints ``ready`` (``http``: its port) once it listens, and ends with its client.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
import time

import psycopg

from supervisor.client import Client
from worker.store.postgres.pipeline import Prepared, write_pipelined

_TEXT_OID = 25
_INT8_OID = 20
_BYTEA_OID = 17
_INSERT = Prepared(
    name=b"floor_append",
    sql=b"INSERT INTO loopd_log_chunks (session, epoch, start, data) VALUES ($1, 1, $2, $3)",
    types=(_TEXT_OID, _INT8_OID, _BYTEA_OID),
    formats=(0, 0, 1),
)
FLOOR_SESSION = "floor-relay"
"""The session row the PostgreSQL relay writes under (made by the benchmark)."""


def _accept_one(path: str) -> socket.socket:
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)
    print("ready", flush=True)
    conn, _addr = server.accept()
    server.close()
    return conn


def _read_exactly(conn: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def relay_file(log: str, path: str, size: int) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    conn = _accept_one(path)
    try:
        while (data := _read_exactly(conn, size)) is not None:
            os.write(fd, data)
            os.fdatasync(fd)
            conn.sendall(b"k")
    finally:
        conn.close()
        os.close(fd)


def relay_postgres(uri: str, path: str, size: int) -> None:
    db = psycopg.connect(uri, autocommit=True)
    conn = _accept_one(path)
    offset, prepare = 0, True
    try:
        while (data := _read_exactly(conn, size)) is not None:
            values = [FLOOR_SESSION.encode(), str(offset).encode(), data]
            write_pipelined(db, _INSERT, values, prepare=prepare, on_sent=lambda: None)
            prepare = False
            offset += len(data)
            conn.sendall(b"k")
    finally:
        conn.close()
        db.close()


class _Pipe(asyncio.Protocol):
    """One side of a relayed connection: what it reads is written to its peer."""

    def __init__(self, peer: asyncio.Transport | None = None) -> None:
        self.peer = peer
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert self.peer is not None  # reading starts once the peer is connected
        self.peer.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None:
            self.peer.close()


class _Front(_Pipe):
    """A TCP client's side: reading waits until its worker connection is made."""

    def __init__(self, client: Client, session: str) -> None:
        super().__init__()
        self._client = client
        self._session = session
        self._linking: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.transport is not None
        self.transport.pause_reading()
        self._linking = asyncio.ensure_future(self._link())

    async def _link(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + 30
        sock = await loop.run_in_executor(None, self._client.connect, self._session, deadline)
        front = self.transport
        assert front is not None
        self.peer, _back = await loop.create_unix_connection(lambda: _Pipe(front), sock=sock)
        front.resume_reading()


def relay_http(home: str, session: str) -> None:
    """Serve on a thread's loop until stdin closes (the benchmark's end)."""
    client = Client(home)
    ready = threading.Event()
    port: list[int] = []

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Front(client, session), "127.0.0.1", 0)
        port.append(server.sockets[0].getsockname()[1])
        ready.set()
        await asyncio.Event().wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    ready.wait(30)
    print(port[0], flush=True)
    sys.stdin.read()  # the benchmark closes our stdin when it is done
    client.close()


def main(argv: list[str]) -> int:
    kind, *args = argv
    if kind == "file":
        relay_file(args[0], args[1], int(args[2]))
    elif kind == "postgres":
        relay_postgres(args[0], args[1], int(args[2]))
    elif kind == "http":
        relay_http(args[0], args[1])
    else:
        raise SystemExit(f"unknown relay {kind!r}: file, postgres or http")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
