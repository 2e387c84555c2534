"""The worker's loop: its control channel and its clients' direct connections, one selector.

The supervisor hands the worker one end of a socketpair per client (``attach``, the
descriptor travelling by SCM_RIGHTS), so requests go from client to worker without a
relay; a TCP client's connection is handed over raw (``attach`` with ``tls``) and makes
its TLS handshake here (``tls_peer``). Requests that arrive together, from any
connections, are applied as one batch: the app writes their records with one write and
one fdatasync, and each reply is queued only after that fsync returned. At every turn
the loop stamps the time into a heartbeat cell shared with the supervisor (a store to
memory, no message), so a worker that stops (SIGSTOP) or spins is noticed and replaced
without waking an idle supervisor.
"""

from __future__ import annotations

import selectors
import socket
import time
from types import FrameType
from typing import Final

from worker.app import App
from worker.ipc.heartbeat import HeartbeatCell
from worker.ipc.lease_deadline import LeaseFence
from worker.ipc.peer import Peer
from worker.ipc.wire import Message, WireError, error, field, ok, request_id_problem
from worker.loop.record_feed import records_page
from worker.loop.replies import describe, durable_point, error_code, error_reply, streams
from worker.loop.signal_wake import SignalWake
from worker.loop.tls_peer import Handshake, TlsAcceptor, TlsPeer
from worker.loop.turns import DEFAULT_MAX_BATCH, Target, TurnRunner
from worker.store.errors import NotOwnerNow, SessionBroken, SessionError
from worker.store.session import Session
from worker.store.stats import STATS

STATE_REPORT_DELAY: Final = 0.05
"""After requests change the session, its state (epoch, records) reaches the supervisor
within this many seconds, at most once per interval."""


class Server:
    """Answers requests until told to stop or until the control channel closes."""

    def __init__(
        self,
        session: Session,
        app: App,
        control: socket.socket,
        *,
        heartbeat: float | None = None,
        heartbeat_cell: HeartbeatCell | None = None,
        request_deadline: float | None = None,
        hang_timeout: float | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        poisoned: dict[bytes, int] | None = None,
        fence: LeaseFence | None = None,
        tls: tuple[str, str, str] | None = None,
    ) -> None:
        self.session = session
        self.fence = fence  # cluster mode: no write, no reply without a proven lease
        self.app = app
        self.control = Peer(control, takes_fds=True)
        self.heartbeat = heartbeat
        self.heartbeat_cell = heartbeat_cell
        self.runner = TurnRunner(
            app, session, cell=heartbeat_cell, request_deadline=request_deadline,
            hang_timeout=hang_timeout, max_batch=max_batch, poisoned=poisoned,
        )  # fmt: skip
        self.selector = selectors.DefaultSelector()
        self.peers: dict[int, Peer] = {}
        self._events: dict[int, int] = {}
        self._stop = False
        self.acceptor = TlsAcceptor(tls)  # TCP connections handed over: CA, cert, key
        STATS.reset()  # count this worker's own work, not what opening it or a parent did
        self._report_due: float | None = None

    def on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        """SIGTERM: stop at the loop's next turn; never inside a batch or a write.

        A stop (an operator's, a hibernation's, the daemon's shutdown) never cuts a
        request short, and never repeats or tears a reply half sent; the daemon's stop
        deadline still bounds a batch that never ends. The signal's wake-up descriptor
        ends a wait in select at once.
        """
        self._stop = True

    def run(self) -> None:
        self._add(self.control)
        wake = SignalWake()
        self.selector.register(wake.sock, selectors.EVENT_READ, None)
        try:
            while not self._stop:
                batch: list[tuple[Peer, object, Message]] = []
                for key, mask in self.selector.select(self._timeout()):
                    peer: Peer | Handshake | None = key.data
                    if peer is None:
                        wake.drain()
                        continue
                    if isinstance(peer, Handshake):
                        self._handshake(peer)
                        continue
                    if mask & selectors.EVENT_WRITE:
                        peer.flush()
                    if mask & selectors.EVENT_READ and not peer.closed:
                        self._read(peer, batch)
                    if self._stop:
                        break
                self._apply(batch)
                for peer in list(self.peers.values()):
                    peer.flush()
                    self._update(peer)
                if self.heartbeat_cell is not None:
                    self.heartbeat_cell.beat()  # a store to shared memory: it wakes no one
                self._report_state()
                for late in self.acceptor.expire(time.monotonic()):
                    self.selector.unregister(late.sock)
        finally:
            if self._report_due is not None and not self.control.closed:
                # Stopped (SIGTERM) before the report was due: the supervisor still hears
                # the final state (the schedules it delivers) before the end of stream.
                self._report_due = 0.0
                self._report_state()
            for peer in list(self.peers.values()):
                peer.flush()  # what the sockets take now: the replies of the last batch
            for peer in list(self.peers.values()):
                self._remove(peer)
            self.acceptor.close()
            self.selector.close()
            wake.close()

    # -- connections --------------------------------------------------------------------

    def _add(self, peer: Peer) -> None:
        self.peers[peer.fileno()] = peer
        self._events[peer.fileno()] = selectors.EVENT_READ
        self.selector.register(peer.sock, selectors.EVENT_READ, peer)

    def _handshake(self, handshake: Handshake) -> None:
        """Step a TCP connection's TLS handshake; once done, it is a peer like the others."""
        if handshake.sock.fileno() < 0:
            # Dropped earlier in this turn (closed for a newer handshake by an attach
            # read first) and unregistered then: its event of the same turn is stale.
            return
        peer = self.acceptor.step(handshake)
        if handshake.fileno() in self.acceptor.pending:
            self.selector.modify(handshake.sock, handshake.wants, handshake)
            return
        self.selector.unregister(handshake.sock)  # done, or failed and closed
        if peer is not None:
            self._add(peer)

    def _remove(self, peer: Peer) -> None:
        fd = peer.fileno()
        if self.peers.pop(fd, None) is not None:
            self.selector.unregister(peer.sock)
            del self._events[fd]
        if peer is not self.control:
            peer.close()

    def _update(self, peer: Peer) -> None:
        """Read only from a client that reads its replies; watch for writability if owed.

        The control channel is always read, whatever is queued to it: the daemon reads
        the worker's replies whatever it has queued for the worker, and bounds both, so
        neither end's flow control ever stops the other direction (no deadlock).
        """
        if peer.closed or peer.fileno() not in self.peers:
            return
        events = 0 if peer.backed_up and peer is not self.control else selectors.EVENT_READ
        if peer.out:
            events |= selectors.EVENT_WRITE
        if events == 0:
            events = selectors.EVENT_WRITE
        if events != self._events[peer.fileno()]:
            self._events[peer.fileno()] = events
            self.selector.modify(peer.sock, events, peer)

    def _read(self, peer: Peer, batch: list[tuple[Peer, object, Message]]) -> None:
        try:
            messages = peer.read()
        except WireError as exc:
            # A bad frame gets an error reply, never a crash. The requests whole before
            # it in the same bytes are applied and answered first; what was buffered
            # after it is dropped, so the next frame is read from a clean state.
            peer.reader.reset()
            self._take(peer, exc.decoded, batch)
            self._apply(batch)
            batch.clear()
            peer.queue(error(None, "bad_frame", str(exc)))
            return
        if messages is None:
            if peer is self.control:
                self._stop = True  # the supervisor is gone: never leave an orphan behind
            else:
                self._remove(peer)
            return
        self._take(peer, messages, batch)

    def _take(
        self, peer: Peer, messages: list[Message], batch: list[tuple[Peer, object, Message]]
    ) -> None:
        """Add a peer's requests to the batch; act on its other messages in order."""
        for message in messages:
            request_id = message.get("id")
            op = message.get("op")
            if peer is not self.control and (problem := request_id_problem(request_id)):
                # Checked as the daemon checks them: a reply must fit a frame whatever
                # the request's id (a 1 MiB id would make every reply too large).
                peer.queue(error(None, "bad_request", problem))
                continue
            if isinstance(peer, TlsPeer) and peer.refusal is not None:
                peer.queue(error(request_id, "forbidden", peer.refusal))  # its role's
                continue
            if op == "request":
                try:
                    batch.append((peer, request_id, field(message, "request", dict)))
                except WireError as exc:
                    peer.queue(error(request_id, "bad_request", str(exc)))
                continue
            self._apply(batch)  # what came before this message is answered first
            batch.clear()
            self._control_op(peer, message)
            if self._stop:
                return

    def _control_op(self, peer: Peer, message: Message) -> None:
        session = self.session
        request_id = message.get("id")
        op = message.get("op")
        if op == "status":
            peer.queue(ok(request_id, {"state": describe(session), "peers": self._counts()}))
        elif op == "records":
            try:
                peer.queue(ok(request_id, records_page(session, message)))
            except WireError as exc:
                peer.queue(error(request_id, "bad_request", str(exc)))
            except SessionError as exc:
                # A sealed log that cannot be read: this read fails, the session serves on.
                peer.queue(error(request_id, "unreadable", str(exc)))
        elif peer is not self.control:
            peer.queue(error(request_id, "bad_request", f"unknown op {op!r}"))
        elif op == "attach":
            fd = self.control.take_fd()
            if fd is None:
                return
            if message.get("tls") is not True:
                self._add(Peer(socket.socket(fileno=fd)))
                return
            if (oldest := self.acceptor.make_room()) is not None:
                self.selector.unregister(oldest.sock)
            if (handshake := self.acceptor.start(socket.socket(fileno=fd), message)) is not None:
                self.selector.register(handshake.sock, handshake.wants, handshake)
        elif op == "compact":
            self._compact(request_id, message)
        elif op == "durable_point":  # between batches (loopd backup)
            peer.queue(durable_point(request_id, session))
        elif op == "stop":
            peer.queue(ok(request_id, {"state": describe(session)}))
            self._stop = True
        else:
            peer.queue(error(request_id, "bad_request", f"unknown op {op!r}"))

    # -- requests -------------------------------------------------------------------------

    def _apply(self, batch: list[tuple[Peer, object, Message]]) -> None:
        """Apply the requests that arrived together, in chunks the runner sizes."""
        if not batch:
            return
        # Until every reply is queued, the daemon's idle check sees a request in
        # progress in the shared cell: a worker that is serving is never idle.
        if self.heartbeat_cell is not None:
            self.heartbeat_cell.set_busy(True)
        try:
            done = 0
            while done < len(batch) and not (done and self._stop):
                # Told to stop (SIGTERM): the chunk in progress was finished and answered;
                # no new one starts. The rest see the end of stream and retry by key.
                size = self.runner.chunk_size()
                self._apply_chunk(batch[done : done + size])
                done += size
                if done < len(batch):
                    for peer in list(self.peers.values()):
                        peer.flush()  # the earlier requests' replies go out now
                    if self.heartbeat_cell is not None:
                        self.heartbeat_cell.beat()
        finally:
            if self.heartbeat_cell is not None:
                self.heartbeat_cell.set_busy(False)

    def _apply_chunk(self, batch: list[tuple[Peer, object, Message]]) -> None:
        started = time.perf_counter()
        chunk = [
            (Target(peer, request_id, streams=streams(peer, self.control, payload)), payload)
            for peer, request_id, payload in batch
        ]
        if self.fence is not None:
            try:
                self.fence.check()  # nothing is written without a proven lease
            except NotOwnerNow as exc:
                results: list[Message | SessionError | WireError] = [exc] * len(batch)
            else:
                results = self.runner.run(chunk)
        else:
            results = self.runner.run(chunk)
        state = describe(self.session)
        lost = self._lease_lost()
        for (target, _), result in zip(chunk, results, strict=True):
            peer, request_id = target.peer, target.request_id
            if lost is not None and not isinstance(result, SessionError | WireError):
                # Durable, on a copy another owner may have replaced: the outcome is
                # unknown; the client retries by key at the owner ("duplicate" if held).
                peer.queue(error(request_id, error_code(lost), str(lost)))
            elif isinstance(result, WireError):
                peer.queue(error(request_id, "bad_request", str(result)))
            elif isinstance(result, SessionError):
                # The lease checked before the chunk, LogSealed, any other store refusal.
                peer.queue(error_reply(request_id, result))
            else:
                result["state"] = state
                if target.dropped:
                    result["partials_dropped"] = target.dropped
                if self.fence is not None:
                    result["token"] = self.fence.token
                peer.queue(ok(request_id, result))
        STATS.requests += len(batch)
        elapsed = time.perf_counter() - started
        for _ in batch:
            STATS.request_latency.observe(elapsed)
        self._state_changed()
        if self.session.broken is not None:
            for peer in list(self.peers.values()):
                peer.flush()
            # A broken session refuses every append: exit, and be reopened from disk.
            raise SessionBroken(self.session.log_path, self.session.broken)

    def _lease_lost(self) -> NotOwnerNow | None:
        """After the fsync, before any reply: is the node's lease still proven?"""
        if self.fence is None:
            return None
        try:
            self.fence.check()
        except NotOwnerNow as exc:
            return exc
        return None

    def _compact(self, request_id: object, message: Message) -> None:
        """Close the epoch now; an EpochEnd that reached the disk is answered as applied."""
        session = self.session
        summary = message.get("summary")
        if not isinstance(summary, str):
            summary = self.app.summarize(session)
        try:
            session.commit_epoch(summary, self.app.next_baseline(session, summary))
        except SessionError as exc:
            if not session.epoch_closed:
                self.control.queue(error(request_id, type(exc).__name__, str(exc)))
                if session.broken is None:
                    return
                raise
            # The EpochEnd is durable: the change is decided, and the restart that
            # follows completes it with this summary (resume never writes a second one).
            self.control.queue(
                ok(request_id, {"state": describe(session), "summary": summary,
                                "completes_on_restart": True})
            )  # fmt: skip
            self.control.flush()
            raise
        self._state_changed()
        self.control.queue(ok(request_id, {"state": describe(session), "summary": summary}))

    # -- the supervisor -------------------------------------------------------------------

    def _state_changed(self) -> None:
        if self._report_due is None and self.heartbeat_cell is not None:
            self._report_due = time.monotonic() + STATE_REPORT_DELAY

    def _timeout(self) -> float | None:
        """Turn at each heartbeat, report due and handshake deadline."""
        due = [] if self.heartbeat is None else [self.heartbeat]
        for when in (self._report_due, self.acceptor.next_deadline()):
            if when is not None:
                due.append(max(0.0, when - time.monotonic()))
        return min(due) if due else None

    def _counts(self) -> Message:
        """The worker's connections: local (unix) and TCP (TLS) peers, handshakes."""
        tls = sum(isinstance(p, TlsPeer) for p in self.peers.values())
        local = len(self.peers) - tls - 1  # the control channel is not a client
        return {"local": local, "tls": tls, "handshakes": len(self.acceptor.pending)}

    def _report_state(self) -> None:
        """Tell the supervisor the new epoch and record count, at most once an interval."""
        if self._report_due is None or time.monotonic() < self._report_due:
            return
        self._report_due = None
        # The worker's counters ride along, for the supervisor's metrics and idle check.
        self.control.queue(
            {"op": "state", "state": describe(self.session), "stats": STATS.snapshot()}
        )
        self.control.flush()
