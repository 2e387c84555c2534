"""A TCP connection of the node's TLS port, handed to its session's worker by the loop.

The TLS thread (``tls_gateway``) reads a connection's preamble naming a session, then
asks the daemon's loop, through ``call_soon_threadsafe``, to hand the raw socket to that
session's worker: the same ``connect`` a local client makes, so a hibernated session is
woken and a starting one queues the connection, and the worker gets the socket over
its control channel (``handover``). Exactly one reply comes back to the thread: ok (the
worker holds the socket now; the thread closes its copy) or an error, which the thread
answers the client over TLS itself (the reply names the session's tenant, ``owner``, so
that a refusal says nothing more to another tenant than no session would). The loop
never closes the socket: it only passes its
descriptor on; the thread owns it from the accept to the end.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Mapping
from typing import Protocol

from supervisor.sessions.endpoints import Waiter
from supervisor.sessions.tenants import TenantBook
from worker.ipc.wire import Message, error


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

    def request(self, session: str, sock: socket.socket, done: Callable[[Message], None]) -> None:
        """Ask for ``sock`` to go to ``session``'s worker; ``done`` gets the one reply (on
        the daemon's loop, or here at once if the loop is closed)."""
        try:
            self.loop.call_soon_threadsafe(self._on_loop, session, sock, done)
        except RuntimeError:  # the loop closed: the daemon is ending
            done(error(None, "no_daemon", "the node is shutting down"))

    def _on_loop(self, session: str, sock: socket.socket, done: Callable[[Message], None]) -> None:
        hosted = self.sessions.get(session)
        if hosted is None:
            done(error(None, "not_found", f"no session {session!r} is hosted on this node"))
            return
        owner = self.tenants.owner(session)

        def answered(message: Message) -> None:  # the owner too: the thread's refusal's
            done({**message, "owner": owner})

        hosted.submit(Waiter(_ThreadReply(answered), None, sock, owner), {"op": "connect"})
