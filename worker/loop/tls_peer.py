"""TCP connections handed to the worker: their TLS handshake, then a peer like any other.

The node's TLS thread reads a connection's preamble naming this session, checks the
client certificate's tenant in a TLS session of its own (closed again before the
handover), and hands the raw socket over (``attach`` with ``tls``, the descriptor by
SCM_RIGHTS). The worker then makes the client's second TLS handshake itself, with the
node's certificate, without ever blocking its loop: the socket is non-blocking, each
step of the handshake runs when the selector says the socket is ready, each handshake
has HANDSHAKE_TIMEOUT seconds in all, and at most MAX_HANDSHAKES run at once: a new one
closes the oldest still running, so peers that open handshakes and never finish them
cannot keep a client out (a client's own handshake takes a round trip or two, a stalled
one its whole time). A peer that stalls, sends plaintext or a certificate of another CA
costs one line on the worker's stderr (its session log) and nothing else. A verified
peer of a role that may not send (``tls_roles.DIRECT_ROLES``), or a client whose
certificate's tenant is not the session's (the ``owner`` the daemon's ``attach`` names;
none: the operator's), has each of its requests answered ``forbidden`` (one line), as
the TLS thread answers an op a role may not ask; nothing of it is applied.
"""

from __future__ import annotations

import socket
import ssl
import sys
import time
from typing import Final

from worker.ipc.peer import READ_SIZE, Peer
from worker.ipc.tls_roles import (
    HANDSHAKE_TIMEOUT,
    TlsSetupError,
    refusal,
    server_context,
    tenant_refusal,
)
from worker.ipc.wire import Message

MAX_HANDSHAKES: Final = 32
"""TLS handshakes one worker makes at once; one more closes the oldest of them (as many
as the node's TLS thread takes: a burst of clients opening their first connection to
one session at once is not cut off at the fifth)."""
WRITE_CHUNK: Final = 1 << 16
"""Bytes given to one TLS write: a retry after WANT_WRITE always starts with the same."""


class TlsPeer(Peer):
    """A peer over TLS: reads and writes never block; WANT_READ/WANT_WRITE mean 'later'."""

    sock: ssl.SSLSocket

    def __init__(self, sock: ssl.SSLSocket, who: str, refusal: str | None = None) -> None:
        super().__init__(sock)
        self.who = who
        self.refusal = refusal
        """Why this peer may send nothing (its certificate's role), or None."""

    def read(self) -> list[Message] | None:
        data = bytearray()
        try:
            while True:
                chunk = self.sock.recv(READ_SIZE)
                if not chunk:
                    if data:
                        break  # the end of stream is seen at the next read
                    return None
                data += chunk
                if not self.sock.pending():
                    break
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            if not data:
                return []
        except (ssl.SSLError, OSError):
            return None  # reset, or a TLS alert: as good as end of stream
        return self.reader.feed(bytes(data))

    def flush(self) -> None:
        while self.out and not self.closed:
            try:
                sent = self.sock.send(self.out[:WRITE_CHUNK])
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                return
            except (ssl.SSLError, OSError):
                self.out.clear()  # gone: its end of stream closes it
                return
            del self.out[:sent]


class Handshake:
    """One TCP connection's TLS handshake in progress, stepped by the worker's selector."""

    def __init__(
        self, sock: ssl.SSLSocket, who: str, deadline: float, owner: str | None = None
    ) -> None:
        self.sock = sock
        self.who = who
        self.deadline = deadline
        self.owner = owner  # the session's tenant; None: the operator's
        self.wants = 1  # selectors.EVENT_READ: the client speaks first

    def fileno(self) -> int:
        return self.sock.fileno()

    def step(self) -> bool:
        """Advance; True once done. Raises ssl.SSLError or OSError if it failed."""
        try:
            self.sock.do_handshake()
        except ssl.SSLWantReadError:
            self.wants = 1
            return False
        except ssl.SSLWantWriteError:
            self.wants = 2  # selectors.EVENT_WRITE
            return False
        return True


class TlsAcceptor:
    """Makes the handshakes of the TCP connections handed to one worker."""

    def __init__(self, files: tuple[str, str, str] | None) -> None:
        self.files = files
        self._context: ssl.SSLContext | None = None
        self.pending: dict[int, Handshake] = {}
        self.refused = 0

    def make_room(self) -> Handshake | None:
        """At the limit: the oldest handshake, dropped (its socket closed) for a new one."""
        if len(self.pending) < MAX_HANDSHAKES:
            return None
        oldest = min(self.pending.values(), key=lambda h: h.deadline)
        self.drop(oldest, f"closed for a newer handshake ({MAX_HANDSHAKES} at once at most)")
        return oldest

    def start(self, sock: socket.socket, attach: Message | None = None) -> Handshake | None:
        """Begin the handshake of a socket handed over by ``attach`` (``make_room``
        first), for a client of the tenant it names as the session's ``owner``; None if
        it was closed instead."""
        who = _peer_name(sock)
        try:
            context = self._context_or_fail()
            sock.setblocking(False)
            wrapped = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        except (TlsSetupError, OSError, ssl.SSLError) as exc:
            sock.close()
            self.report(who, str(exc))
            return None
        owner = (attach or {}).get("owner")
        handshake = Handshake(
            wrapped, who, time.monotonic() + HANDSHAKE_TIMEOUT,
            owner if isinstance(owner, str) else None,
        )  # fmt: skip
        self.pending[handshake.fileno()] = handshake
        return handshake

    def step(self, handshake: Handshake) -> TlsPeer | None:
        """Advance ``handshake``; the peer once it is done and allowed, else None (still
        under way, or closed: ``handshake.fileno()`` is then out of ``pending``)."""
        try:
            if not handshake.step():
                return None
        except (ssl.SSLError, OSError) as exc:
            self.drop(handshake, refusal(exc))
            return None
        del self.pending[handshake.fileno()]
        problem = tenant_refusal(handshake.sock.getpeercert(), handshake.owner)
        if problem is not None:
            self.report(handshake.who, problem)  # each of its requests is answered forbidden
        return TlsPeer(handshake.sock, handshake.who, problem)

    def expire(self, now: float) -> list[Handshake]:
        """The handshakes past their deadline, dropped (their sockets closed)."""
        late = [h for h in self.pending.values() if h.deadline <= now]
        for handshake in late:
            self.drop(handshake, refusal(TimeoutError()))
        return late

    def next_deadline(self) -> float | None:
        return min((h.deadline for h in self.pending.values()), default=None)

    def drop(self, handshake: Handshake, why: str) -> None:
        self.pending.pop(handshake.fileno(), None)
        handshake.sock.close()
        self.report(handshake.who, why)

    def close(self) -> None:
        for handshake in list(self.pending.values()):
            handshake.sock.close()
        self.pending.clear()

    def report(self, who: str, why: str) -> None:
        self.refused += 1
        print(f"tls: refused {who}: {why}", file=sys.stderr, flush=True)

    def _context_or_fail(self) -> ssl.SSLContext:
        """The node's server context, made at the first connection handed over."""
        if self._context is None:
            if self.files is None:
                raise TlsSetupError("this worker was started without the node's certificate")
            self._context = server_context(*self.files)
        return self._context


def _peer_name(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except (OSError, ValueError, TypeError):
        return "a peer"
    return f"{host}:{port}"
