"""A TCP connection of the node's TLS port, handed to its session's worker by the loop.

The TLS thread (``tls_gateway``) reads a connection's preamble naming a session, makes a
TLS handshake of its own to learn the peer certificate's tenant, and asks the daemon's
loop, through ``call_soon_threadsafe``, whether that tenant may reach the session
(``check``): nothing is handed over nor woken for a tenant that may not, and a session
that is not there is no tenant's, so both are answered the same ``forbidden``. Once the
client may go on, the thread asks for the raw socket to go to the session's worker
(``request``): the same ``connect`` a local client makes, so a hibernated session is
woken and a starting one queues the connection, and the worker gets the socket over
its control channel (``handover``). Exactly one reply comes back to the thread each
time: ok (the worker holds the socket now; the thread closes its copy) or an error,
which the thread answers the client over TLS itself. The loop never closes the socket:
it only passes its descriptor on; the thread owns it from the accept to the end.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Mapping
from typing import Protocol

from supervisor.sessions.endpoints import Waiter
from supervisor.sessions.tenants import TenantBook
from worker.ipc.tls_roles import not_yours
from worker.ipc.wire import Message, error, ok


class Submits(Protocol):
    """What a hosted session offers here (``HostedSession.submit``)."""

    def submit(self, waiter: Waiter, request: Message) -> None: ...


class _ThreadReply:
    """A waiter's client whose one reply goes back to the TLS thread."""

    def __init__(self, done: Callable[[Message], None]) -> None:
        self._done = done
        self._answered = False

    def reply(self, message: Message) -> None:
        if not self._answered:
            self._answered = True
            self._done(message)

    def reply_relayed(self, message: Message) -> None:
        self.reply(message)

    def reply_with_fd(self, message: Message, fd: int) -> bool:
        return False  # never asked: a TCP connect is answered by reply()


class TcpHandover:
    """Hands TCP sockets to workers on the daemon's loop; called from the TLS thread."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sessions: Mapping[str, Submits],
        tenants: TenantBook,
    ) -> None:
        self.loop = loop
        self.sessions = sessions
        self.tenants = tenants

    def check(self, session: str, tenant: str | None, done: Callable[[Message], None]) -> None:
        """Whether ``tenant`` (None: the operator) may reach ``session``; ``done`` gets the
        one reply. Wakes nothing, hands nothing over."""
        self._call(lambda: done(self._refusal(session, tenant) or ok(None, None)), done)

    def request(
        self,
        session: str,
        sock: socket.socket,
        tenant: str | None,
        done: Callable[[Message], None],
    ) -> None:
        """Ask for ``sock`` to go to ``session``'s worker, for ``tenant`` (checked again:
        the session may have changed hands since ``check``); ``done`` gets the one reply
        (on the daemon's loop, or here at once if the loop is closed)."""
        self._call(lambda: self._on_loop(session, sock, tenant, done), done)

    def _call(self, then: Callable[[], None], done: Callable[[Message], None]) -> None:
        try:
            self.loop.call_soon_threadsafe(then)
        except RuntimeError:  # the loop closed: the daemon is ending
            done(error(None, "no_daemon", "the node is shutting down"))

    def _refusal(self, session: str, tenant: str | None) -> Message | None:
        """The one answer to a tenant of a session not its own, or to an id with no
        session (the same bytes for both); None if the caller may reach it."""
        if tenant is not None and (
            session not in self.sessions or self.tenants.owner(session) != tenant
        ):
            return error(None, "forbidden", not_yours(tenant))
        if session not in self.sessions:  # told to the operator only
            return error(None, "not_found", f"no session {session!r} is hosted on this node")
        return None

    def _on_loop(
        self, session: str, sock: socket.socket, tenant: str | None, done: Callable[[Message], None]
    ) -> None:
        refused = self._refusal(session, tenant)
        if refused is not None:
            done(refused)
            return
        owner = self.tenants.owner(session)

        def answered(message: Message) -> None:  # the owner too: the thread's refusal's
            done({**message, "owner": owner})

        self.sessions[session].submit(
            Waiter(_ThreadReply(answered), None, sock, owner), {"op": "connect"}
        )
