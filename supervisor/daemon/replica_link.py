"""An owner's replication link to this node, served by a thread of its own.

An owner's link to a follower opens with ``transport.REPLICA_PREAMBLE``; the gateway's
loop reads it and hands the raw socket here (docs/scaling.md, "The follower"). One
thread per link then does everything with blocking calls: the TLS handshake (with the
node's context, within HANDSHAKE_TIMEOUT in all), the check that the peer's certificate
is a node's, and for each frame the sender's check (``SenderCheck``), the apply
(``ReplicaReceiver.handle``) and the reply, written from this thread. A write never
passes the gateway's loop nor a hop to another thread: a ``replicate`` round trip is
the transport, the apply and nothing else.

Only the replication ops (``replica_receiver.OPS``) are served here: a node's other
ops, and every op of a client or operator certificate, are answered ``forbidden`` in
one line and nothing is written. At most ``MAX_LINKS`` threads run at once; past the cap
a link is refused here (``start`` says False) and served by the gateway's loop as a
connection without a preamble is, so a peer that opens links it never completes can
slow the owner's links, never keep them out. A reply the peer does not read within
SEND_TIMEOUT ends the link (its thread with it); an idle link has no read deadline.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Final

from supervisor.cluster.replica_receiver import OPS as REPLICA_OPS
from supervisor.cluster.replica_receiver import WRITES as REPLICA_WRITES
from supervisor.cluster.replica_receiver import ReplicaReceiver
from supervisor.cluster.replica_sender import NotTheOwner, SenderCheck
from supervisor.cluster.transport import (
    HANDSHAKE_TIMEOUT,
    Role,
    describe,
    dns_names,
    refusal,
    role_of,
)
from worker.wire import REPLICA_MAX_FRAME, FrameReader, Message, WireError, encode, error

MAX_LINKS: Final = 64
"""Replication links served by threads of their own at once (handshaking or serving)."""
SEND_TIMEOUT: Final = 10.0
"""Seconds one reply may take to be written before the link is ended."""
READ_SIZE: Final = 1 << 16
JOIN_TIMEOUT: Final = 5.0


def answer_replica(
    receiver: ReplicaReceiver, senders: SenderCheck | None, message: Message, names: list[str]
) -> Message:
    """A replica op's reply; a write only from the session's owner in etcd (replica_sender)."""
    if senders is not None and message.get("op") in REPLICA_WRITES:
        try:
            senders.check(message, names)
        except NotTheOwner as exc:
            return error(message.get("id"), "not_owner", str(exc))
    return receiver.handle(message)


class ReplicaLinks:
    """The threads serving a node's replication links; ``answer`` applies one request."""

    def __init__(
        self,
        context: ssl.SSLContext,
        answer: Callable[[Message, list[str]], Message],
        report: Callable[[str], None],
        *,
        limit: int = MAX_LINKS,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
    ) -> None:
        self.context = context
        self.answer = answer
        self.report = report
        self.limit = limit
        self.handshake_timeout = handshake_timeout
        self.served = 0  # links handed a thread, in all
        self._lock = threading.Lock()
        self._links: dict[threading.Thread, socket.socket] = {}
        self._closing = False

    @property
    def running(self) -> int:
        """Threads serving a link now."""
        with self._lock:
            return len(self._links)

    def start(self, conn: socket.socket, peer: str) -> bool:
        """Serve ``conn`` in a thread of its own (it is this object's then); False, with
        ``conn`` untouched, when MAX_LINKS threads run already or the node is ending."""
        with self._lock:
            if self._closing or len(self._links) >= self.limit:
                return False
            thread = threading.Thread(
                target=self._run, args=(conn, peer), name="loopd-replica-link", daemon=True
            )
            self._links[thread] = conn
            self.served += 1
        thread.start()
        return True

    def close(self) -> None:
        """End every link (its socket shut down wakes its thread) and join the threads."""
        with self._lock:
            self._closing = True
            links = dict(self._links)
        for conn in links.values():
            with contextlib.suppress(OSError):  # not connected: its thread is ending already
                conn.shutdown(socket.SHUT_RDWR)
        for thread in links:
            thread.join(JOIN_TIMEOUT)

    def _run(self, conn: socket.socket, peer: str) -> None:
        me = threading.current_thread()
        try:
            conn.settimeout(self.handshake_timeout)  # do_handshake's deadline, for the whole
            with self.context.wrap_socket(
                conn, server_side=True, do_handshake_on_connect=False
            ) as sock:
                with self._lock:
                    self._links[me] = sock  # what close() shuts down from now on
                    if self._closing:
                        return
                try:
                    sock.do_handshake()
                except (OSError, ssl.SSLError) as exc:
                    self.report(f"tls: refused {peer} (replication link): {refusal(exc)}")
                    return
                self._serve(sock, peer)
        except OSError:
            pass  # the peer went away, a reply did not drain, or the node is ending
        finally:
            conn.close()
            with self._lock:
                self._links.pop(me, None)

    def _serve(self, sock: ssl.SSLSocket, peer: str) -> None:
        cert = sock.getpeercert()
        role = role_of(cert)
        who = f"{peer} ({describe(cert)})"
        if role is None:
            self.report(f"tls: refused {who}: a certificate without a loopd role")
            return
        names = dns_names(cert)
        frames = FrameReader(REPLICA_MAX_FRAME)  # one group commit is never cut
        while True:
            sock.settimeout(None)  # an idle link waits for its next step
            data = sock.recv(READ_SIZE)
            if not data:
                return
            try:
                messages = frames.feed(data)
            except WireError as exc:  # the peer is told why, then the link ends
                self.report(f"tls: refused {who}: a bad frame: {exc}")
                self._send(sock, error(None, "bad_frame", f"{exc}: the connection ends"))
                return
            for message in messages:
                self._send(sock, self._reply(message, role, names, who))

    def _reply(self, message: Message, role: Role, names: list[str], who: str) -> Message:
        op = message.get("op")
        if role is Role.NODE and op in REPLICA_OPS:
            return self.answer(message, names)
        why = (f"a {role.value} certificate may not ask {op!r:.80}" if role is not Role.NODE
               else f"op {op!r:.80} is not served on a replication link")  # fmt: skip
        self.report(f"tls: refused {who}: {why}")
        return error(message.get("id"), "forbidden", why)

    def _send(self, sock: ssl.SSLSocket, reply: Message) -> None:
        sock.settimeout(SEND_TIMEOUT)  # TimeoutError (an OSError) ends the link
        sock.sendall(encode(reply))
