"""A node's TLS port: ``--listen tls://HOST:PORT`` (docs/scaling.md, "The transport").

The port is served by a thread of the daemon with an event loop of its own, never by the
daemon's loop. Each connection is a TLS 1.3 handshake that requires a certificate of
the cluster CA; a peer refused (another CA, expired, no certificate, not TLS at all, no
role) costs one line in the daemon's log and nothing else. An accepted peer's control
requests are checked against its role (``transport.ALLOWED``) and relayed, frame by
frame, to the node's own control socket, whose replies go back unchanged: what a remote
client may ask is exactly what a local one may, less what its certificate forbids. A
``loopd-client``'s requests carry its certificate's tenant, set here over whatever it
sent, and reach that tenant's sessions only (docs/operations.md, "Tenants"); the relay
is ``tls_relay``.

A connection that opens with the plaintext preamble of the direct data path
(``transport.DIRECT_PREAMBLE`` and a session's id) is served here only until its
certificate's tenant is checked against the session's owner (``tls_direct``,
``tls_check``): then the raw socket goes to the session's worker (``tcp_handover``),
which makes a second TLS handshake and serves the connection itself, so a client's
requests never pass this thread nor the daemon's loop. A tenant refused, or a session
that is not here, is answered one error frame by this thread before anything is handed
over or woken.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import Callable, Iterator
from typing import Final

from supervisor.cluster.transport import (
    HANDSHAKE_TIMEOUT,
    Role,
    TlsFiles,
    TransportError,
    describe,
    own_certificate_problem,
    parse_tls_address,
    refusal,
    role_of,
)
from supervisor.errors import ServeError
from supervisor.gateway.tls_check import GatewayTls
from supervisor.gateway.tls_direct import (
    HandsOver,
    Refused,
    accept_tls,
    answer_instead,
    hand_off,
    read_preamble,
    verdict,
)
from supervisor.gateway.tls_relay import relay
from supervisor.loop_thread import LoopThread, cancel_the_rest
from worker.ipc.tls_roles import tenant_of

BACKLOG: Final = 128
MAX_HANDSHAKES: Final = 32
"""Preambles and TLS handshakes in progress at once; one more closes the oldest of them.
A handshake holds a few hundred KB until it ends or times out, and needs no certificate
to start: without a cap, peers that open and never finish would grow the node; closing
the newest instead would let a few idle connections keep every client out."""
MAX_CONNECTIONS: Final = 1024
"""Connections (handshaking or relaying) at once; beyond, a new one is closed at once."""


class TlsGateway:
    """The TLS port of one node, relaying accepted peers to ``control_path``."""

    def __init__(
        self,
        address: str,
        files: TlsFiles,
        control_path: str,
        report: Callable[[str], None],
        handover: HandsOver | None = None,
    ) -> None:
        try:
            self.host, self.port = parse_tls_address(address)
            self.context = files.server_context()
            self.direct_context = files.server_context()
        except TransportError as exc:
            raise ServeError(str(exc)) from exc
        # The direct path's first session ends at once: tickets to resume it are bytes
        # the client would have to read before the close.
        self.direct_context.num_tickets = 0
        self.address = address
        self.control_path = control_path
        self.report = report
        self.handover = handover
        self.handed_over = 0
        self.refused = 0
        self.connections = 0
        self._handshakes: dict[asyncio.Task[None], str] = {}  # in progress
        self._arrived: dict[asyncio.Task[None], int] = {}  # each connection's arrival
        self._arrivals = itertools.count()
        self._sock: socket.socket | None = None
        self._thread = LoopThread("loopd-tls", self._serve)
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def handshaking(self) -> int:
        """Preambles and handshakes in progress now."""
        return len(self._handshakes)

    @contextlib.contextmanager
    def _handshake(self, peer: str) -> Iterator[None]:
        """Count the current task's preamble or handshake; at the cap, the oldest is
        cancelled (its connection closed) to make room: peers that open connections and
        finish none cannot keep a client's few round trips out."""
        task = asyncio.current_task()
        assert task is not None
        # The oldest by arrival: a connection whose preamble ended and whose handshake
        # begins re-enters here, and keeps its place.
        if task not in self._arrived:
            self._arrived[task] = next(self._arrivals)
        if len(self._handshakes) >= MAX_HANDSHAKES:
            oldest = min(self._handshakes, key=lambda t: self._arrived.get(t, 0))
            why = f"closed for a newer handshake ({MAX_HANDSHAKES} at once at most)"
            self._refuse(self._handshakes.pop(oldest), why)
            oldest.cancel()
        self._handshakes[task] = peer
        try:
            yield
        finally:
            self._handshakes.pop(task, None)

    def open(self) -> None:
        """Bind and listen (ServeError in one line if the port cannot be had), then serve."""
        try:
            infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            family, kind, proto, _name, where = infos[0]
            sock = socket.socket(family, kind, proto)
        except OSError as exc:
            raise ServeError(f"--listen {self.address}: {exc.strerror or exc}") from exc
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(where)
            sock.listen(BACKLOG)
        except OSError as exc:
            sock.close()
            raise ServeError(
                f"--listen {self.address}: cannot listen: {exc.strerror or exc}"
            ) from exc
        sock.setblocking(False)
        self._sock = sock
        self._thread.start()

    def close(self) -> None:
        """Stop accepting, end every relayed connection, join the thread."""
        self._thread.stop()

    async def _serve(self, ready: Callable[[], None], stopped: asyncio.Event) -> None:
        assert self._sock is not None
        accepting = asyncio.ensure_future(self._accept(self._sock))
        ready()
        try:
            await stopped.wait()
        finally:
            accepting.cancel()
            await cancel_the_rest()
            self._sock.close()

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        failing = False
        while True:
            try:
                conn, where = await loop.sock_accept(listener)
            except OSError as exc:  # EMFILE and the like: accept again in a moment
                if not failing:  # one line until an accept succeeds again
                    self.report(f"tls: cannot accept: {exc.strerror or exc}")
                failing = True
                await asyncio.sleep(0.1)
                continue
            failing = False
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # the worker's too
            peer = f"{where[0]}:{where[1]}" if isinstance(where, tuple) else str(where)
            task = asyncio.ensure_future(self._connection(conn, peer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _connection(self, conn: socket.socket, peer: str) -> None:
        if self.connections >= MAX_CONNECTIONS:
            self._refuse(peer, f"{MAX_CONNECTIONS} connections in progress already (the limit)")
            conn.close()
            return
        self.connections += 1
        try:
            try:
                with self._handshake(peer):
                    session = await read_preamble(conn)
            except (Refused, OSError) as exc:
                self._refuse(peer, str(exc))
                conn.close()
                return
            except asyncio.CancelledError:  # closed for a newer one, or the node is ending
                conn.close()
                raise
            if session is None:  # TLS at once: served here
                await self._serve_one(conn, peer)
            else:
                await self._direct(conn, peer, session)
        finally:
            self.connections -= 1
            self._arrived.pop(asyncio.current_task(), None)  # type: ignore[arg-type]

    async def _direct(self, conn: socket.socket, peer: str, session: str) -> None:
        """Check the peer's tenant over a TLS session of this thread's, then hand the
        connection to ``session``'s worker; or answer why not, and close."""
        tls = GatewayTls(conn, self.direct_context)
        try:
            with self._handshake(peer):
                async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                    answer, tenant, problem = await verdict(
                        self.handover, session, await tls.handshake()
                    )
                    await tls.send(answer)
                    if answer.get("ok") is True:
                        await tls.close()  # the client's next handshake is the worker's
        except (OSError, TimeoutError) as exc:
            self._refuse(peer, refusal(exc))
            conn.close()
            return
        except asyncio.CancelledError:
            conn.close()
            raise
        if answer.get("ok") is not True or self.handover is None:
            if problem is not None:
                self._refuse(peer, problem)
            with contextlib.suppress(OSError, TimeoutError):  # it reads the frame, then ends
                async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                    await tls.close()
            conn.close()
            return
        reply = await hand_off(self.handover, session, conn, tenant)
        if reply.get("ok") is True:
            self.handed_over += 1
            conn.close()  # the worker holds its own copy now
            return
        with self._handshake(peer):
            problem = await answer_instead(conn, self.context, reply, session)
        if problem is not None:
            self._refuse(peer, problem)

    async def _serve_one(self, conn: socket.socket, peer: str) -> None:
        try:
            with self._handshake(peer):
                reader, writer = await accept_tls(conn, self.context)
        except (OSError, TimeoutError) as exc:
            self._refuse(peer, refusal(exc))
            return
        cert = writer.get_extra_info("peercert")
        role = role_of(cert)
        problem = f"a certificate without a loopd role ({describe(cert)})"
        if role is Role.CLIENT and tenant_of(cert) is None:
            problem = f"a loopd-client certificate without a tenant (O= or CN=) ({describe(cert)})"
        if role is None or (role is Role.CLIENT and tenant_of(cert) is None):
            self._refuse(peer, problem)
            writer.transport.abort()
            return
        try:
            await relay(
                reader,
                writer,
                role,
                f"{peer} ({describe(cert)})",
                cert,
                self.control_path,
                self._refuse,
            )
        except (OSError, asyncio.IncompleteReadError):
            pass  # the peer or the daemon went away: the connection ends
        finally:
            writer.transport.abort()

    def _refuse(self, peer: str, why: str) -> None:
        self.refused += 1
        self.report(f"tls: refused {peer}: {why}")


def open_gateway(
    listen: str | None,
    tls: TlsFiles | None,
    node: str | None,
    control_path: str,
    report: Callable[[str], None],
    handover: HandsOver | None = None,
) -> TlsGateway | None:
    """The node's TLS port, listening, or None without ``--listen``; ServeError (one line)
    if it is given without its certificate, or with one that is not this node's."""
    if listen is None:
        if tls is not None:
            raise ServeError("--tls-ca/--tls-cert/--tls-key need --listen tls://HOST:PORT")
        return None
    if node is None:
        raise ServeError("--listen needs --cluster URL and --node NAME")
    if tls is None:
        raise ServeError(f"--listen {listen} needs --tls-ca, --tls-cert and --tls-key")
    problem = own_certificate_problem(tls, node)
    if problem is not None:
        raise ServeError(problem)
    gateway = TlsGateway(listen, tls, control_path, report, handover)
    gateway.open()
    return gateway
