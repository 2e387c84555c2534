"""The daemon as a cluster node: its ``ServingNode``, and every etcd call made off the loop.

``create`` and ``adopt`` ask etcd first (place, claim). Those calls run in a small pool
of threads and their outcome comes back to the loop as a callback, so the loop serves
every other session and control connection while etcd is slow or away; each call ends
by its deadline (``CALL_TIMEOUT``). At most one job per session runs at a time, and at
most ``MAX_PENDING`` in all: beyond, a request is answered ``busy``. An etcd that did
not answer (or answered badly) is ``unavailable``, never ``exists``. The keepalive
thread's news (trouble, a new lease, sessions claimed again) reaches the loop the same
way, through ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final, TypeVar

from supervisor.cluster.errors import AlreadyPlaced, ClusterError, Cordoned, NotOwner
from supervisor.cluster.ownership import unplace
from supervisor.errors import ServeError
from supervisor.hosting.intent import IntentError, IntentFile
from supervisor.node.failover_stored import StoredFailoverWatch
from supervisor.node.serving import ServingNode, WorkerCluster
from supervisor.sessions.endpoints import Waiter
from supervisor.sessions.hosted import HostedSession
from supervisor.states import State
from worker.ipc.wire import Message, error, ok

__all__ = ["MAX_PENDING", "DaemonNode"]

THREADS: Final = 2
MAX_PENDING: Final = 64
"""etcd jobs waiting or running at once; beyond, create and adopt answer ``busy``."""
T = TypeVar("T")


class DaemonNode:
    """One daemon's cluster side, driven from its loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        serving: ServingNode,
        sessions: dict[str, HostedSession],
        report: Callable[[str], None],
        stopping: Callable[[], bool],
        on_idle: Callable[[], None],
    ) -> None:
        self.loop = loop
        self.serving = serving
        self.sessions = sessions
        self.report = report
        self.stopping = stopping
        self.on_idle = on_idle  # a job ended while the daemon stops: it may be done now
        self.pending: set[str] = set()  # sessions with an etcd job waiting or running
        self.watch: StoredFailoverWatch | None = None  # takes over sessions in a database
        # How the daemon hosts a session under its worker arguments (set by the loop).
        self.host: Callable[[str, WorkerCluster], HostedSession] | None = None
        self.intent: IntentFile | None = None  # the node's intent file (set by the loop)
        self._executor = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="etcd")
        # Both are called in the keepalive thread; what they do happens in the loop.
        serving.node.on_reclaimed = lambda _claims: self._in_loop(self._reclaimed)
        serving.node.lease.on_problem = lambda line: self._in_loop(self.report, f"cluster: {line}")

    def start(self) -> list[str]:
        """Register and claim (before the loop serves anyone); the sessions served here."""
        try:
            served = self.serving.start()
        except ClusterError as exc:
            raise ServeError(
                f"cannot join the cluster at {self.serving.client.url}: {exc}"
            ) from exc
        if self.serving.node.stored:  # its sessions in a database: any node serves them
            self.watch = StoredFailoverWatch(
                self.serving.client, self.serving.node, self.serving.node.lease.timing.ttl / 3,
                lambda session, _token: self._in_loop(self._host_taken, session),
                lambda line: self._in_loop(self.report, line),
            )  # fmt: skip
            self.watch.start()
        return served

    def close(self) -> None:
        """Wait for the etcd jobs (each ends by its deadline), then revoke the lease."""
        if self.watch is not None:
            self.watch.close()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self.serving.close()

    def _host_taken(self, session: str) -> None:
        """A session taken over here by the failover watch: claim it, serve it."""
        if self.host is None or self.stopping():
            return
        host = self.host
        waiter = Waiter(_Reported(self.report, session), None)
        self.adopt(waiter, session, lambda claimed: host(session, claimed))

    def worker_args(self, session: str) -> WorkerCluster | None:
        return self.serving.worker_args(session)

    def idle(self) -> bool:
        """True when no etcd job waits or runs."""
        return not self.pending

    def refuse_busy(self, waiter: Waiter, session: str) -> bool:
        """Answer ``busy`` (and return True) if a job of ``session`` or too many are pending."""
        if session in self.pending:
            why = f"{session}: a create or adopt of it is in progress; retry"
        elif len(self.pending) >= MAX_PENDING:
            why = f"etcd is slow: {len(self.pending)} cluster operations are waiting; retry"
        else:
            return False
        waiter.client.reply(error(waiter.request_id, "busy", why))
        return True

    def place(self, waiter: Waiter, session: str, then: Callable[[WorkerCluster], None]) -> None:
        """Place and own a new session in etcd off the loop; ``then`` hosts it, in the loop."""

        def placed(args: WorkerCluster | None, exc: Exception | None) -> None:
            if exc is not None or args is None:
                code = _code(exc)
                message = str(exc) if code != "unavailable" else f"{exc}; nothing was created"
                waiter.client.reply(error(waiter.request_id, code, message))
            elif self.stopping():
                waiter.client.reply(
                    error(waiter.request_id, "unavailable", "the daemon is stopping")
                )
                self._run(session, lambda: self._unplace(session, args), lambda _r, _e: None)
            else:
                then(args)

        self._run(session, lambda: self.serving.place(session), placed)

    def adopt(
        self, waiter: Waiter, session: str, host: Callable[[WorkerCluster], HostedSession]
    ) -> None:
        """``adopt``: claim a session moved here in etcd (off the loop) and serve it; ``host``
        makes its hosted entry under the claimed token."""
        hosted = self.sessions.get(session)
        if hosted is not None and hosted.state in (State.RUNNING, State.STARTING):
            waiter.client.reply(ok(waiter.request_id, hosted.status()))
        elif hosted is not None and hosted.worker is not None:
            waiter.client.reply(error(waiter.request_id, "busy", f"{session} is stopping"))
        elif not self.refuse_busy(waiter, session):
            self.claim(waiter, session, lambda args: self._adopted(waiter, session, args, host))

    def _adopted(
        self,
        waiter: Waiter,
        session: str,
        claimed: WorkerCluster,
        host: Callable[[WorkerCluster], HostedSession],
    ) -> None:
        current = self.sessions.get(session)
        if current is not None and current.worker is not None:  # started meanwhile
            waiter.client.reply(ok(waiter.request_id, current.status()))
            return
        self.sessions.pop(session, None)  # a stale entry holds an older token
        # Served here from now on: a ``stopped`` left by a move's ``stop`` (this node the
        # source of a move aborted, or back here later) is no operator's; a restart serves it.
        try:
            if self.intent is not None:
                self.intent.mark(session, stopped=False)
        except IntentError as exc:
            self.report(f"{session}: its stop is still in the intent file: {exc}")
        fresh = host(claimed)
        fresh.ready_waiters.append(waiter)
        fresh.start()

    def forget(self, waiter: Waiter, session: str, intent: IntentFile) -> None:
        """``forget``: stop listing a stopped session whose files left this node, and clear
        its intent entry here: the ``stop`` of the move that took it away is no operator's
        word, and a session moved back later is served after this node's restart."""
        hosted = self.sessions.get(session)
        if hosted is not None and hosted.worker is None:
            del self.sessions[session]
        if session not in self.sessions:
            try:
                intent.forget(session)
            except IntentError as exc:
                waiter.client.reply(error(waiter.request_id, "intent", str(exc)))
                return
        waiter.client.reply(ok(waiter.request_id, None))

    def claim(self, waiter: Waiter, session: str, then: Callable[[WorkerCluster], None]) -> None:
        """Claim a session moved to this node, off the loop; ``then`` hosts it, in the loop."""

        def claimed(args: WorkerCluster | None, exc: Exception | None) -> None:
            if exc is not None:
                code = "not_owner" if isinstance(exc, NotOwner) else _code(exc)
                waiter.client.reply(error(waiter.request_id, code, str(exc)))
            elif args is None:
                waiter.client.reply(error(waiter.request_id, "not_owner", f"{session}: not ours"))
            elif self.stopping():
                waiter.client.reply(
                    error(waiter.request_id, "unavailable", "the daemon is stopping")
                )
            else:
                then(args)

        self._run(session, lambda: self.serving.claim(session), claimed)

    def move_step(self, waiter: Waiter, op: str, session: str, fields: Message) -> None:
        """A move's step on this node's disk (seal, pull, release), off the loop."""
        if self.refuse_busy(waiter, session):
            return

        def stepped(result: dict[str, object] | None, exc: Exception | None) -> None:
            if exc is not None:
                code = "move_failed" if isinstance(exc, ClusterError) else "io_error"
                waiter.client.reply(error(waiter.request_id, code, str(exc)))
            else:
                waiter.client.reply(ok(waiter.request_id, result))

        self._run(session, lambda: self.serving.move_step(op, session, dict(fields)), stepped)

    def _unplace(self, session: str, args: WorkerCluster) -> None:
        """Undo a placement made for a create the daemon will not host (it is stopping)."""
        unplace(self.serving.client, session, args.node, args.token)

    def _run(
        self,
        session: str,
        job: Callable[[], T],
        done: Callable[[T | None, Exception | None], None],
    ) -> None:
        """Run ``job`` in a thread; ``done`` with its result or its error, in the loop."""
        self.pending.add(session)
        future = self.loop.run_in_executor(self._executor, job)

        def finished(_future: asyncio.Future[T]) -> None:
            self.pending.discard(session)
            if future.cancelled():
                return
            exc = future.exception()
            if exc is None:
                done(future.result(), None)
            elif isinstance(exc, ClusterError | OSError):
                done(None, exc)
            else:
                raise exc
            if self.stopping():
                self.on_idle()

        future.add_done_callback(finished)

    def _in_loop(self, callback: Callable[..., object], *args: object) -> None:
        """Have the loop call ``callback``; nothing once the loop is closed (the daemon ended)."""
        with contextlib.suppress(RuntimeError):  # "Event loop is closed"
            self.loop.call_soon_threadsafe(callback, *args)

    def _reclaimed(self) -> None:
        """Restart each worker whose token changed; stop those this node no longer serves."""
        if self.stopping():
            return
        for session_id, hosted in list(self.sessions.items()):
            args = self.worker_args(session_id)
            if args == hosted.spec.cluster:
                continue
            if args is None:
                self.report(f"{session_id}: no longer served here (quarantined or moved)")
                if hosted.worker is not None:
                    hosted.stop()
                continue
            hosted.spec = dataclasses.replace(hosted.spec, cluster=args)
            if hosted.worker is not None:  # an idle or stopped session starts with the new one
                hosted.stop(restart=True)


def _code(exc: Exception | None) -> str:
    """The control error code of a failed placement."""
    if isinstance(exc, AlreadyPlaced):
        return "exists"
    if isinstance(exc, Cordoned):
        return "cordoned"
    if isinstance(exc, NotOwner):
        return "not_owner"
    return "unavailable"  # etcd did not answer, or badly; a file error of a claim


class _Reported:
    """The client of a request the daemon makes itself: a failed reply goes to its log."""

    def __init__(self, report: Callable[[str], None], session: str) -> None:
        self.report = report
        self.session = session

    def reply(self, message: Message) -> None:
        if message.get("ok") is not True:
            self.report(f"{self.session}: failover: not served here: {message.get('error')}")

    def reply_relayed(self, message: Message) -> None:
        self.reply(message)

    def reply_with_fd(self, message: Message, fd: int) -> bool:
        self.reply(message)
        return False
