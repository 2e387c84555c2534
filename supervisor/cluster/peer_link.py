"""One connection to a node's TLS port (``tls://HOST:PORT``), checked to be that node.

Used by the clients and by a node pulling a moved session's files from another node.

The handshake is TLS 1.3 with this client's certificate; the node's certificate must be
of the cluster CA, carry the node role and name, in its subjectAltName, the node that
etcd named (``server_hostname``): a node reached at the address another node registered
is refused. Control requests then travel as on the unix socket, one frame each way.
Every failure is a one-line ``ControlError``: ``no_daemon`` (nothing listens there),
``tls_refused`` (either side refused the other's certificate, or the peer is not a TLS
node), ``closed``, ``timeout``.
"""

from __future__ import annotations

import itertools
import socket
import ssl
import time

from supervisor.cluster.transport import (
    TlsFiles,
    TransportError,
    check_node_certificate,
    parse_tls_address,
    refusal,
)
from supervisor.errors import ControlError
from worker.ipc.wire import MAX_FRAME, FrameReader, Message, WireError, encode

READ_SIZE = 1 << 18


def result_of(reply: Message) -> object:
    """The result of a reply, or ControlError with its code and message."""
    if reply.get("ok") is True:
        return reply.get("result")
    failure = reply.get("error")
    if isinstance(failure, dict):
        raise ControlError(str(failure.get("code")), str(failure.get("message")))
    raise ControlError("bad_reply", f"unexpected reply {reply!r:.200}")


class NodeLink:
    """A persistent TLS connection to one node, made on first use and after a failure."""

    def __init__(self, address: str, node: str, files: TlsFiles, *, timeout: float) -> None:
        self.address = address
        self.node = node
        self.files = files
        self.timeout = timeout
        self._sock: ssl.SSLSocket | None = None
        self._reader = FrameReader()
        self._ids = itertools.count(1)
        self._context: ssl.SSLContext | None = None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def call(self, op: str, **fields: object) -> object:
        """One control request to the node; its result, or ControlError (one line)."""
        request_id = next(self._ids)
        request: Message = {"id": request_id, "op": op}
        request.update({k: v for k, v in fields.items() if v is not None})
        try:
            frame = encode(request, MAX_FRAME)
        except WireError as exc:
            raise ControlError("too_large", str(exc)) from exc
        sock = self._connect()
        deadline = time.monotonic() + self.timeout
        try:
            sock.settimeout(self.timeout)
            sock.sendall(frame)
            reply = self._read_reply(sock, deadline)
        except ControlError:
            self.close()
            raise
        except ssl.SSLError as exc:
            self.close()
            raise ControlError(
                "tls_refused", f"node {self.node} at {self.address} refused this client: "
                f"{refusal(exc)}",
            ) from exc  # fmt: skip
        except TimeoutError as exc:
            self.close()
            raise ControlError("timeout", f"node {self.node} at {self.address} did not "
                               f"answer within {self.timeout:g} s") from exc  # fmt: skip
        except OSError as exc:
            self.close()
            raise ControlError("closed", f"node {self.node} at {self.address} closed the "
                               f"connection: {exc.strerror or exc}") from exc  # fmt: skip
        if reply.get("id") not in (request_id, None):
            self.close()
            raise ControlError("bad_reply", f"node {self.node}: a reply to another request")
        return result_of(reply)

    def _read_reply(self, sock: ssl.SSLSocket, deadline: float) -> Message:
        return read_reply(sock, self._reader, deadline, self.node,
                          f"node {self.node} at {self.address} closed the connection")  # fmt: skip

    def _connect(self) -> ssl.SSLSocket:
        if self._sock is not None:
            return self._sock
        try:
            host, port = parse_tls_address(self.address)
            if self._context is None:
                self._context = self.files.client_context()
        except TransportError as exc:
            raise ControlError("bad_address", str(exc)) from exc
        where = f"node {self.node} at {self.address}"
        sock = connect_to_node(host, port, self.node, self._context, self.timeout, where)
        self._sock = sock
        self._reader = FrameReader()
        return sock


def read_reply(
    sock: ssl.SSLSocket, reader: FrameReader, deadline: float, node: str, closed: str
) -> Message:
    """The next reply frame on ``sock`` by ``deadline`` (TimeoutError after it); a
    ControlError ``closed`` (``closed`` + " without a reply") at an end of stream, or
    ``bad_reply`` for bytes that are not frames."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        data = sock.recv(READ_SIZE)
        if not data:
            raise ControlError("closed", f"{closed} without a reply")
        try:
            replies = reader.feed(data)
        except WireError as exc:
            raise ControlError("bad_reply", f"node {node}: {exc}") from exc
        if replies:
            return replies[0]


def connect_to_node(
    host: str,
    port: int,
    node: str,
    context: ssl.SSLContext,
    timeout: float,
    where: str,
    *,
    preamble: bytes = b"",
    closed_during_handshake: str | None = None,
) -> ssl.SSLSocket:
    """A TLS connection to ``node`` at ``host:port`` whose certificate is that node's.

    ``preamble`` goes in the clear before the handshake (the direct path's). A failure
    is a one-line ControlError about ``where``: ``no_daemon`` (no connection),
    ``tls_refused`` (the handshake or the node's certificate refused), and the rest as
    ``handshake_with_node`` says.
    """
    try:
        raw = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise ControlError("no_daemon", f"cannot reach {where}: {exc.strerror or exc}") from exc
    try:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if preamble:
            raw.sendall(preamble)  # then TLS at once: the node's TLS thread answers
    except OSError as exc:
        raw.close()
        opened = closed_during_handshake or "this link"
        raise ControlError(
            "closed", f"{where} closed the connection of {opened} before its handshake: "
            f"{exc.strerror or exc}",
        ) from exc  # fmt: skip
    return handshake_with_node(
        raw, node, context, timeout, where, closed_during_handshake=closed_during_handshake
    )


def handshake_with_node(
    raw: socket.socket,
    node: str,
    context: ssl.SSLContext,
    timeout: float,
    where: str,
    *,
    closed_during_handshake: str | None = None,
) -> ssl.SSLSocket:
    """A TLS handshake over ``raw`` with ``node``, whose certificate must be that node's;
    ``raw`` is closed if it fails.

    A failure is ControlError ``tls_refused``. With ``closed_during_handshake`` (what was
    being opened), a connection the peer ended during the handshake is ``closed``
    instead: nothing was sent and no certificate was refused, so the caller may look
    the owner up again.
    """
    try:
        raw.settimeout(timeout)
        sock = context.wrap_socket(raw, server_hostname=node)
    except (ssl.SSLError, OSError) as exc:
        raw.close()
        ended = isinstance(exc, ssl.SSLEOFError) or not isinstance(exc, ssl.SSLError)
        if closed_during_handshake is None or not ended:
            raise ControlError("tls_refused", f"{where}: {refusal(exc)}") from exc
        why = refusal(exc) if isinstance(exc, ssl.SSLError) else exc.strerror or exc
        raise ControlError(
            "closed", f"{where} closed the connection of {closed_during_handshake} during its "
            f"handshake: {why}",
        ) from exc  # fmt: skip
    try:
        check_node_certificate(sock.getpeercert(), node)
    except TransportError as exc:
        sock.close()
        raise ControlError("tls_refused", f"{where}: {exc}") from exc
    except OSError as exc:  # ended before the handshake began: ssl saw no connection
        sock.close()
        opened = closed_during_handshake or "this link"
        raise ControlError(
            "closed", f"{where} closed the connection of {opened} before its handshake: "
            f"{exc.strerror or exc}",
        ) from exc  # fmt: skip
    return sock
