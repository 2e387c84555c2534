"""The worker's own TLS link to one follower node (``worker.replication.FollowerChannel``).

A replicated session's worker ships its commits itself, with the node's certificate
(the daemon hands it the files' paths and the followers' addresses): TLS 1.3 both ways,
the follower's certificate checked against the cluster CA, against the follower's
name (``server_hostname``: the name etcd gave) and for the ``loopd-node`` role, as the
cluster transport does (docs/scaling.md, "The transport"). The connection opens with
``tls_roles.REPLICA_PREAMBLE``: the follower serves it in a thread of its own, for the
replication ops only. Requests are the control frames (``worker.wire``), answered in
the order they were sent: a call waits for its answer, while the owner's shipping puts
each group's ``replicate`` on the wire (``send``) and reads the answers later
(``acknowledged``), after its own fdatasync. Any failure is a ``ShipFailed`` in one line
and closes the connection (the next request connects again).
"""

from __future__ import annotations

import collections
import itertools
import socket
import ssl
import time
from typing import Final

from worker.catch_up import ShipFailed
from worker.store.replica_types import Position, Step
from worker.tls_roles import REPLICA_PREAMBLE
from worker.wire import REPLICA_MAX_FRAME, FrameReader, Message, WireError, encode

NODE_ROLE: Final = "loopd-node"
READ_SIZE: Final = 1 << 16


def node_context(ca: str, cert: str, key: str) -> ssl.SSLContext:
    """A client context presenting the node's certificate; OSError or SSLError if unreadable."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.verify_mode = ssl.CERT_REQUIRED
    context.check_hostname = True
    context.load_verify_locations(cafile=ca)
    context.load_cert_chain(cert, key)
    return context


class TlsFollower:
    """A persistent TLS connection to the follower ``node`` at ``tls://HOST:PORT``."""

    def __init__(
        self, node: str, address: str, context: ssl.SSLContext, *, timeout: float = 5.0
    ) -> None:
        self._node = node
        self.address = address
        self.context = context
        self.timeout = timeout
        self._sock: ssl.SSLSocket | None = None
        self._reader = FrameReader()
        self._ids = itertools.count(1)
        self._unanswered: collections.deque[int] = collections.deque()  # ids sent, in order
        self._replies: collections.deque[Message] = collections.deque()  # read, not taken

    @property
    def node(self) -> str:
        return self._node

    def close(self) -> None:
        """Close the connection; what was sent and not answered is not answered."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._unanswered.clear()
        self._replies.clear()

    def ship(self, step: Step) -> Position:
        position = self._position(self._call({"op": "replicate", "step": step.to_message()}))
        if position is None:
            raise ShipFailed(f"{self._node}: the reply holds no position")
        return position

    def send(self, step: Step) -> None:
        """Put a ``replicate`` of ``step`` on the wire without waiting for its answer
        (``acknowledged`` reads it); ShipFailed if it could not be sent."""
        self._request({"op": "replicate", "step": step.to_message()})

    def acknowledged(self, deadline: float) -> Position:
        """The copy's position in the answer to the oldest ``send`` not yet answered,
        read by ``deadline`` (``time.monotonic()``); ShipFailed otherwise."""
        position = self._position(self._answer(deadline))
        if position is None:
            raise ShipFailed(f"{self._node}: the reply holds no position")
        return position

    def position(self, session: str) -> Position | None:
        return self._position(self._call({"op": "replica_position", "session": session}))

    def line_ends(self, session: str, epoch: int) -> tuple[int, list[list[int]]]:
        result = self._call({"op": "replica_line_ends", "session": session, "epoch": epoch})
        return parse_line_ends(self._node, result)

    def rewind(self, session: str, keep: Position, token: int) -> Position:
        request = {"op": "replica_rewind", "session": session, "position": keep.to_message(),
                   "token": token}  # fmt: skip
        position = self._position(self._call(request))
        if position is None:
            raise ShipFailed(f"{self._node}: the reply holds no position")
        return position

    def _position(self, result: object) -> Position | None:
        value = result.get("position") if isinstance(result, dict) else None
        try:
            return Position.from_message(value)
        except ValueError as exc:
            raise ShipFailed(f"{self._node}: a bad reply: {exc}") from exc

    def _call(self, request: Message) -> object:
        if self._unanswered:  # answers to sends still to come would be taken for this one's
            raise self._failed(ShipFailed(
                f"{self._node}: a call while {len(self._unanswered)} sent steps wait for "
                "their answers"
            ))  # fmt: skip
        self._request(request)
        return self._answer(time.monotonic() + self.timeout)

    def _request(self, request: Message) -> None:
        """Send ``request`` (its id set here); its answer is the next one not taken."""
        request["id"] = request_id = next(self._ids)
        try:
            frame = encode(request, REPLICA_MAX_FRAME)
            sock = self._connect()
            sock.settimeout(self.timeout)
            sock.sendall(frame)
        except (OSError, WireError, ShipFailed) as exc:
            raise self._failed(exc) from exc
        self._unanswered.append(request_id)

    def _answer(self, deadline: float) -> object:
        """The result of the oldest request sent and not answered (ShipFailed if none)."""
        if not self._unanswered:
            raise ShipFailed(f"{self._node}: no request is waiting for an answer")
        expected = self._unanswered.popleft()
        try:
            reply = self._read_reply(deadline)
        except (OSError, WireError, ShipFailed) as exc:
            raise self._failed(exc) from exc
        if reply.get("id") != expected:
            raise self._failed(ShipFailed(
                f"{self._node}: the answer to request {expected} has id {reply.get('id')!r:.40}"
            ))  # fmt: skip
        if reply.get("ok") is True:
            return reply.get("result")
        failure = reply.get("error")
        if isinstance(failure, dict):
            raise ShipFailed(f"{self._node}: {failure.get('code')}: {failure.get('message')}")
        raise ShipFailed(f"{self._node}: unexpected reply {reply!r:.200}")

    def _failed(self, exc: Exception) -> ShipFailed:
        """Close the connection (its answers are not to be trusted to line up any more)."""
        self.close()
        if isinstance(exc, ShipFailed):
            return exc
        return ShipFailed(f"{self._node} at {self.address}: {exc}")

    def _read_reply(self, deadline: float) -> Message:
        while not self._replies:
            sock = self._sock
            if sock is None:
                raise ShipFailed(f"{self._node}: the connection is closed")
            # Past the deadline, what has arrived is still read (without waiting): the
            # answers of several followers are read one after another, and one that
            # did not answer in time must not fail the others for its wait.
            sock.settimeout(max(0.0, deadline - time.monotonic()))
            try:
                data = sock.recv(READ_SIZE)
            except (TimeoutError, BlockingIOError, ssl.SSLWantReadError):
                raise ShipFailed(f"{self._node}: no answer within {self.timeout:g} s") from None
            if not data:
                raise ShipFailed(f"{self._node} closed the connection without a reply")
            self._replies.extend(self._reader.feed(data))
        return self._replies.popleft()

    def _connect(self) -> ssl.SSLSocket:
        if self._sock is not None:
            return self._sock
        host, _, port = self.address.removeprefix("tls://").rpartition(":")
        if not port.isdigit():
            raise ShipFailed(f"{self._node}: not a tls://HOST:PORT address: {self.address!r}")
        raw = socket.create_connection((host.strip("[]"), int(port)), timeout=self.timeout)
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # the line, then TLS
            raw.sendall(REPLICA_PREAMBLE)  # then TLS at once: served by a thread of its own
            sock = self.context.wrap_socket(raw, server_hostname=self._node)
        except (ssl.SSLError, OSError):
            raw.close()
            raise
        try:
            units = _units(sock.getpeercert())
        except OSError as exc:  # ended before the handshake began: ssl saw no connection
            sock.close()
            raise ShipFailed(f"{self._node} at {self.address} closed the connection: "
                             f"{exc.strerror or exc}") from exc  # fmt: skip
        if units != [NODE_ROLE]:
            sock.close()
            raise ShipFailed(f"{self._node} at {self.address}: not a node certificate")
        self._sock = sock
        self._reader = FrameReader()
        return sock


def _units(cert: object) -> list[str]:
    """The organizational units (the loopd role) of a verified peer certificate's subject."""
    subject = cert.get("subject", ()) if isinstance(cert, dict) else ()
    found = []
    for rdn in subject if isinstance(subject, tuple) else ():
        for pair in rdn:
            if isinstance(pair, tuple) and len(pair) == 2 and pair[0] == "organizationalUnitName":
                found.append(str(pair[1]))
    return found


def parse_line_ends(node: str, result: object) -> tuple[int, list[list[int]]]:
    """A ``replica_line_ends`` reply's epoch and ``[size, crc]`` pairs; ShipFailed if bad."""
    epoch = result.get("epoch") if isinstance(result, dict) else None
    ends = result.get("ends") if isinstance(result, dict) else None
    if type(epoch) is not int or not isinstance(ends, list):
        raise ShipFailed(f"{node}: a bad line_ends reply")
    pairs = [e for e in ends if isinstance(e, list) and len(e) == 2]
    if len(pairs) != len(ends) or not all(type(v) is int and v >= 0 for e in pairs for v in e):
        raise ShipFailed(f"{node}: a bad line_ends reply: each line end must be [size, crc]")
    return epoch, pairs
