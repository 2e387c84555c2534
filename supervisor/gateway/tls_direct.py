"""The direct data path at a node's TLS port: the preamble, the check, the handoff.

A client of the direct path opens its TCP connection with a plaintext line,
``transport.DIRECT_PREAMBLE`` and the session's id, then starts TLS at once. The TLS
thread tells it from a client that starts TLS at once by its first byte (0x16 opens
every TLS handshake), reads the line and nothing after it, and makes a TLS handshake of
its own (``tls_check``): the peer certificate's tenant is checked against the session's
owner on the daemon's loop (``check``) before anything is handed over or woken, and a
session of another tenant is answered exactly as one that is not there. If the client
may go on, it is told so in one frame, both ends close that TLS session, and the thread
asks the daemon's loop to hand the raw socket to the session's worker (``tcp_handover``),
with whom the client makes its second handshake. When the handoff fails after that, the
thread makes that second handshake itself and answers one error frame, so the client
always gets its reason in one line over TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable
from typing import Final, Protocol

from supervisor.cluster.transport import (
    DIRECT_PREAMBLE,
    HANDSHAKE_TIMEOUT,
    MAX_PREAMBLE,
    TransportError,
    parse_preamble,
    refusal,
)
from worker.ipc.tls_roles import (
    Role,
    describe,
    direct_refusal,
    role_of,
    tenant_of,
    tenant_refusal,
)
from worker.ipc.wire import Message, encode, error

READ_SIZE: Final = 1 << 16


class HandsOver(Protocol):
    """Checks a tenant and hands a TCP socket to a session's worker
    (``tcp_handover.TcpHandover``)."""

    def check(self, session: str, tenant: str | None, done: Callable[[Message], None]) -> None: ...

    def request(
        self,
        session: str,
        sock: socket.socket,
        tenant: str | None,
        done: Callable[[Message], None],
    ) -> None: ...


class Refused(Exception):
    """A connection closed before it was served; the message is the log line's reason."""


async def read_preamble(conn: socket.socket) -> str | None:
    """The session a direct connection's preamble names (the line consumed, nothing after
    it); None for a client that starts TLS at once (nothing consumed). Refused if it is
    neither, or says nothing within HANDSHAKE_TIMEOUT."""
    deadline = asyncio.get_running_loop().time() + HANDSHAKE_TIMEOUT
    line = b""
    while True:
        await _readable(conn, deadline)
        try:
            data = conn.recv(MAX_PREAMBLE - len(line), socket.MSG_PEEK)
        except BlockingIOError:
            continue
        if not data:
            raise Refused("closed before it said anything")
        if not line and data[0] != DIRECT_PREAMBLE[0]:
            return None
        end = data.find(b"\n")
        # Only the preamble's bytes are taken: what follows its newline is the TLS
        # handshake, left in the socket for the worker.
        line += conn.recv(end + 1 if end >= 0 else len(data))
        if not DIRECT_PREAMBLE.startswith(line[: len(DIRECT_PREAMBLE)]):
            raise Refused(f"neither TLS nor a loopd preamble: {line[:40]!r}")
        if end >= 0:
            try:
                return parse_preamble(line)
            except TransportError as exc:
                raise Refused(str(exc)) from exc
        if len(line) >= MAX_PREAMBLE:
            raise Refused(f"a preamble longer than {MAX_PREAMBLE} bytes")


async def verdict(
    handover: HandsOver | None, session: str, cert: dict[str, object] | None
) -> tuple[Message, str | None, str | None]:
    """What the TLS thread answers a verified direct peer of ``session`` before any
    handover: ok or the error frame, the peer's tenant (None: the operator), and why it
    was refused for the node's log (None if it was not)."""
    role = role_of(cert)
    tenant = tenant_of(cert) if role is Role.CLIENT else None
    problem = direct_refusal(cert)
    if problem is None and role is Role.CLIENT and tenant is None:
        problem = f"a loopd-client certificate without a tenant (O= or CN=) ({describe(cert)})"
    if problem is not None:
        return error(None, "forbidden", problem), None, problem
    if handover is None:
        return error(None, "unavailable", "this node does not serve the direct path"), None, None
    answer = await may_reach(handover, session, tenant)
    failure = answer.get("error")
    if isinstance(failure, dict) and failure.get("code") == "forbidden":
        return answer, tenant, str(failure.get("message"))
    return answer, tenant, None


async def may_reach(handover: HandsOver, session: str, tenant: str | None) -> Message:
    """The daemon's answer to whether ``tenant`` (None: the operator) may reach
    ``session``: ok, or the error to answer (the same for another tenant's session as
    for none). Nothing is woken or handed over."""
    loop = asyncio.get_running_loop()
    answered: asyncio.Future[Message] = loop.create_future()

    def deliver(message: Message) -> None:
        if not answered.done():
            answered.set_result(message)

    def done(message: Message) -> None:  # on the daemon's loop
        with contextlib.suppress(RuntimeError):  # the thread's loop has ended
            loop.call_soon_threadsafe(deliver, message)

    handover.check(session, tenant, done)
    return await answered


async def hand_off(
    handover: HandsOver, session: str, conn: socket.socket, tenant: str | None
) -> Message:
    """The daemon's one reply to handing ``conn`` to ``session``'s worker. Until it comes
    the daemon's loop may be passing the descriptor on: nothing here closes it."""
    loop = asyncio.get_running_loop()
    answered: asyncio.Future[Message] = loop.create_future()

    def deliver(message: Message) -> None:
        if answered.cancelled():
            conn.close()  # the thread stopped waiting (it is ending): nobody serves it
        else:
            answered.set_result(message)

    def done(message: Message) -> None:  # on the daemon's loop
        try:
            loop.call_soon_threadsafe(deliver, message)
        except RuntimeError:  # the thread's loop has ended
            conn.close()

    handover.request(session, conn, tenant, done)
    return await answered


async def answer_instead(
    conn: socket.socket, context: ssl.SSLContext, reply: Message, session: str
) -> str | None:
    """Make the TLS handshake here and answer the failed handoff's ``reply`` as one error
    frame (``forbidden`` instead to a certificate that may not send, or whose tenant is
    not the session's ``owner`` the reply names: a session that is not there is no
    tenant's, so a client is told no more of it than of another tenant's), then close.
    The refusal for the node's log, if the peer was refused."""
    try:
        reader, writer = await accept_tls(conn, context)
    except (OSError, TimeoutError) as exc:
        return refusal(exc)
    try:
        owner = reply.get("owner")
        problem = tenant_refusal(
            writer.get_extra_info("peercert"), owner if isinstance(owner, str) else None
        )
        failure = reply.get("error")
        if problem is not None:
            answer = error(None, "forbidden", problem)
        elif isinstance(failure, dict):
            answer = error(None, str(failure.get("code")), str(failure.get("message")))
        else:
            answer = error(None, "unavailable", f"session {session}: {reply!r:.200}")
        with contextlib.suppress(OSError, TimeoutError):
            writer.write(encode(answer))
            await writer.drain()
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):  # it reads the frame, then ends
                while await reader.read(READ_SIZE):
                    pass
        return problem
    finally:
        writer.transport.abort()


async def accept_tls(
    conn: socket.socket, context: ssl.SSLContext
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The TLS handshake of an accepted connection, as the server, within HANDSHAKE_TIMEOUT;
    its streams. OSError, ssl.SSLError or TimeoutError if it failed (``conn`` closed)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    try:
        transport, _ = await loop.connect_accepted_socket(
            lambda: protocol, conn, ssl=context, ssl_handshake_timeout=HANDSHAKE_TIMEOUT
        )
    except BaseException:
        conn.close()
        raise
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


async def _readable(conn: socket.socket, deadline: float) -> None:
    """Wait until ``conn`` has bytes (or its end); Refused once ``deadline`` passes."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(conn.fileno(), wake)
    try:
        async with asyncio.timeout_at(deadline):
            await ready
    except TimeoutError:
        raise Refused("no TLS handshake nor preamble in time") from None
    finally:
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(conn.fileno())
