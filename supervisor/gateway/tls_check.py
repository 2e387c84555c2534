"""The TLS thread's own TLS session on a direct connection: the check before a handover.

A client of the direct data path makes two TLS handshakes on its one TCP connection.
The first is with the node's TLS thread, which so learns the peer certificate's tenant
and checks it against the session's owner before anything is handed over or woken
(docs/operations.md, "Tenants"); it answers one frame, and if the client may go on, both
ends close that TLS session (close_notify each way) and the raw socket goes to the
session's worker, with whom the client makes the second handshake. A TLS session cannot
be handed to another process (the ssl module exports no keys), hence two.

The thread reads the socket one TLS record at a time (its 5-byte header, then the length
it gives) and feeds OpenSSL through memory BIOs (``ssl.SSLObject``): OpenSSL sees only
what was read, so once its session is closed not one byte of the client's second
ClientHello has been taken from the socket.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from typing import Final, TypeVar

from worker.ipc.wire import Message, encode

RECORD_HEADER: Final = 5
MAX_RECORD: Final = (1 << 14) + 256
"""The longest TLS 1.3 record's body (RFC 8446, 5.2): a longer length is no TLS."""

_T = TypeVar("_T")


class GatewayTls:
    """One server-side TLS session over ``conn`` (non-blocking), record by record.

    Every method raises ssl.SSLError or OSError if the session failed (EOF included);
    the caller bounds them in time and closes ``conn``."""

    def __init__(self, conn: socket.socket, context: ssl.SSLContext) -> None:
        self.conn = conn
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)

    async def handshake(self) -> dict[str, object] | None:
        """Make the handshake; the peer's verified certificate."""
        await self._step(self._tls.do_handshake)
        cert = self._tls.getpeercert()
        return dict(cert) if cert else None

    async def send(self, message: Message) -> None:
        """Write one frame."""
        data = encode(message)
        await self._step(lambda: self._tls.write(data))

    async def close(self) -> None:
        """Send close_notify and read the peer's: the socket is then plain TCP again, with
        nothing of what the peer sent after its close_notify read."""
        await self._step(self._tls.unwrap)

    async def _step(self, action: Callable[[], _T]) -> _T:
        while True:
            try:
                result = action()
            except ssl.SSLWantReadError:
                await self._flush()
                await self._read_record()
                continue
            await self._flush()
            return result

    async def _flush(self) -> None:
        data = self._outgoing.read()
        if data:
            await asyncio.get_running_loop().sock_sendall(self.conn, data)

    async def _read_record(self) -> None:
        header = await self._exactly(RECORD_HEADER)
        length = int.from_bytes(header[3:5], "big")
        if length > MAX_RECORD:
            raise ssl.SSLError(f"a TLS record of {length} bytes (at most {MAX_RECORD})")
        self._incoming.write(header + await self._exactly(length))

    async def _exactly(self, size: int) -> bytes:
        loop = asyncio.get_running_loop()
        data = b""
        while len(data) < size:
            chunk = await loop.sock_recv(self.conn, size - len(data))
            if not chunk:
                raise ssl.SSLEOFError("the peer closed the connection")
            data += chunk
        return data
