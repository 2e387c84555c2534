"""The direct data path over TCP: one TLS connection to a session's worker on a node.

The connection opens with the plaintext preamble naming the session
(``transport.direct_preamble``), then TLS at once, without waiting for an answer. The
first handshake is with the node's TLS thread, which checks this client's certificate
(its tenant) against the session's owner before anything is handed over or woken, and
answers one frame: an error (the connection ends), or ok, after which both ends close
that TLS session (close_notify) and the client makes a second handshake on the same
socket, with the session's worker, which the node handed the raw socket. The client
checks the node's certificate in each handshake as every client does (the node role,
the name etcd gave as ``server_hostname``). Requests and replies are then the frames of
a local direct connection (``supervisor/client/direct.py``), and never pass the daemon's
loop. If the handoff fails after the check (the session failed to start), the node's TLS
thread makes the second handshake instead and answers one error frame.

Every failure is a one-line ``ControlError``: ``no_daemon`` (nothing listens), ``tls_refused``
(either side refused the other's certificate), ``closed`` (the connection ended without
a reply: the worker died or was replaced; the caller sends again by key), ``timeout``,
or the error the worker or the node answered.
"""

from __future__ import annotations

import itertools
import ssl
import time

from supervisor.cluster.peer_link import connect_to_node, handshake_with_node, read_reply
from supervisor.cluster.transport import (
    TlsFiles,
    TransportError,
    direct_preamble,
    parse_tls_address,
    refusal,
)
from supervisor.errors import ControlError
from worker.ipc.wire import FrameReader, Message, WireError, encode


class DirectLink:
    """A persistent direct connection to ``session``'s worker on ``node``, made on first use
    and again after it ended."""

    def __init__(
        self,
        address: str,
        node: str,
        session: str,
        files: TlsFiles,
        *,
        timeout: float,
        context: ssl.SSLContext | None = None,
    ) -> None:
        self.address = address
        self.node = node
        self.session = session
        self.files = files
        self.timeout = timeout
        self._context = context
        self._sock: ssl.SSLSocket | None = None
        self._reader = FrameReader()
        self._ids = itertools.count(1)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def request(self, payload: Message) -> Message:
        """Send one request (``text``, ``key``, ...) to the worker; its reply frame."""
        request_id = next(self._ids)
        try:
            frame = encode({"id": request_id, "op": "request", "request": payload})
        except WireError as exc:
            raise ControlError("too_large", str(exc)) from exc
        where = f"node {self.node} at {self.address}"
        sock = self._connect()
        if isinstance(sock, dict):
            return sock  # the node's one answer (the check refused): the connection ended
        try:
            sock.settimeout(self.timeout)
            sock.sendall(frame)
            reply = self._read_reply(sock, time.monotonic() + self.timeout)
        except ControlError:
            self.close()
            raise
        except ssl.SSLEOFError as exc:  # the connection ended: no refusal of this client
            self.close()
            raise ControlError(
                "closed", f"{where} closed the connection of session {self.session}: "
                f"{refusal(exc)}",
            ) from exc  # fmt: skip
        except ssl.SSLError as exc:
            self.close()
            raise ControlError(
                "tls_refused", f"{where} refused this client: {refusal(exc)}"
            ) from exc
        except TimeoutError as exc:
            self.close()
            raise ControlError(
                "timeout", f"session {self.session} on {where} did not answer within "
                f"{self.timeout:g} s",
            ) from exc  # fmt: skip
        except OSError as exc:
            self.close()
            raise ControlError(
                "closed", f"{where} closed the connection of session {self.session}: "
                f"{exc.strerror or exc}",
            ) from exc  # fmt: skip
        if reply.get("id") not in (request_id, None):
            self.close()
            raise ControlError("bad_reply", f"{where}: a reply to another request")
        if reply.get("id") is None:
            self.close()  # the node's one answer (the handoff failed): the connection ends
        return reply

    def _read_reply(self, sock: ssl.SSLSocket, deadline: float) -> Message:
        return read_reply(sock, self._reader, deadline, self.node,
                          f"node {self.node} at {self.address} closed the connection of "
                          f"session {self.session}")  # fmt: skip

    def _connect(self) -> ssl.SSLSocket | Message:
        """The connection to the worker, made if need be; or the node's one error frame
        when it refused it (then there is no connection)."""
        if self._sock is not None:
            return self._sock
        where = f"node {self.node} at {self.address}"
        try:
            host, port = parse_tls_address(self.address)
            if self._context is None:
                self._context = self.files.client_context()
            preamble = direct_preamble(self.session)
        except (TransportError, ValueError) as exc:
            raise ControlError("bad_address", str(exc)) from exc
        opened = f"session {self.session}"
        gate = connect_to_node(
            host, port, self.node, self._context, self.timeout, where,
            preamble=preamble, closed_during_handshake=opened,
        )  # fmt: skip
        # The node's TLS thread checked this certificate's tenant: one frame says
        # whether the session may be reached; then plain TCP again, for the worker.
        try:
            answer = self._read_reply(gate, time.monotonic() + self.timeout)
            if answer.get("ok") is not True:
                gate.close()
                return answer
            raw = gate.unwrap()  # close_notify each way
        except ssl.SSLError as exc:
            gate.close()
            raise ControlError(
                "closed", f"{where} closed the connection of {opened} after its check: "
                f"{refusal(exc)}",
            ) from exc  # fmt: skip
        except TimeoutError as exc:
            gate.close()
            raise ControlError(
                "timeout", f"{where} did not answer the check of {opened} within "
                f"{self.timeout:g} s",
            ) from exc  # fmt: skip
        except ControlError:
            gate.close()
            raise
        except OSError as exc:
            gate.close()
            raise ControlError(
                "closed", f"{where} closed the connection of {opened} after its check: "
                f"{exc.strerror or exc}",
            ) from exc  # fmt: skip
        sock = handshake_with_node(  # the worker's
            raw, self.node, self._context, self.timeout, where, closed_during_handshake=opened
        )
        self._sock = sock
        self._reader = FrameReader()
        return sock
