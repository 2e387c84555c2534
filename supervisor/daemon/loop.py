"""``loopd serve``: one supervisor per home, one worker per session, one asyncio loop.

Everything the daemon does is a callback of one single-threaded asyncio loop: control
connections are transports with bounded buffers and flow control, worker deaths arrive
through each worker's pidfd (``add_reader``), timers exist only for backoff, stop
deadlines and hang checks, and signals come through ``add_signal_handler``. Nothing in a
callback blocks, so no client and no worker can stall the others; an idle supervisor
sleeps in ``epoll_wait`` and uses no CPU.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import psutil

from supervisor.daemon.config import ServeConfig
from supervisor.daemon.connection import connect
from supervisor.daemon.database import hosted_sessions
from supervisor.daemon.home import claim_home
from supervisor.daemon.links import ClientConnection, WorkerLink, WorkerWatch
from supervisor.daemon.listener import Listener
from supervisor.daemon.local_sessions import adopt_local, forget_local
from supervisor.daemon.worker_specs import UnknownApp, prepare_workers, worker_spec
from supervisor.errors import ServeError
from supervisor.hosting.intent import IntentError, IntentFile
from supervisor.hosting.runtime import Hosting
from supervisor.sessions.endpoints import Client, Waiter
from supervisor.sessions.hosted import HostedSession
from supervisor.sessions.lock_wait import HolderWait
from supervisor.sessions.spawn import WorkerProcess, WorkerSpec
from supervisor.sessions.tenants import TenantBook
from supervisor.states import State
from supervisor.templates.pool import close_templates
from supervisor.templates.spare import close_spares
from worker.ipc.wire import Message, error
from worker.store.disk.layout import SESSIONS_DIR

if TYPE_CHECKING:
    from supervisor.daemon.cluster_node import DaemonNode
    from supervisor.gateway.tls_gateway import TlsGateway
    from supervisor.node.serving import WorkerCluster

# The cluster's code (etcd, the node, moves, the TLS gateway) is imported by _join_cluster,
# with --cluster only: a daemon of one home starts without it (a restart is downtime, and
# forked workers inherit whatever the daemon has imported).

__all__ = ["ServeConfig", "Supervisor"]

STARTS_PER_TURN: Final = 8


class Supervisor:
    """The daemon: control socket, hosted sessions, and the loop that serves them."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.home = os.path.abspath(config.home)
        self.loop = asyncio.new_event_loop()
        self.sessions: dict[str, HostedSession] = {}
        self.clients: set[ClientConnection] = set()
        self.rng = random.Random(config.seed)
        self._tasks: set[asyncio.Task[object]] = set()
        self._shutting_down = False
        self._done: asyncio.Future[None] = self.loop.create_future()
        self._listener = Listener(self.loop, self.home, self._on_client, self.report)
        self._to_start: deque[HostedSession] = deque()
        self.cluster: DaemonNode | None = None
        self.gateway: TlsGateway | None = None  # --listen tls://: its own thread and loop
        self.hosting = Hosting(self.loop, self.home, config.hosting, self.sessions, self.report)
        self.intent: IntentFile = self.hosting.intent
        self.tenants = TenantBook(self.home)  # who each session belongs to (operations)

    # -- the Loop protocol of HostedSession ---------------------------------------------

    def watch_worker(self, hosted: HostedSession, worker: WorkerProcess) -> WorkerLink:
        link = WorkerLink(worker.sock, hosted)
        watch = WorkerWatch(hosted, worker, link, self.loop, self._finish)
        link.on_end = watch.on_link_end
        connect(self.loop, link, self._tasks, lambda _exc: watch.on_link_end())
        self.loop.add_reader(worker.pidfd, watch.on_death)
        if worker.output is not None:
            self.hosting.watch_output(hosted.id, worker.pid, worker.output)
        return link

    def on_move(self, hosted: HostedSession, old: State, new: State) -> None:
        self.hosting.on_move(hosted, old, new)

    def on_report(self, hosted: HostedSession, message: Message) -> None:
        self.hosting.on_report(hosted, message)

    def wake(self, hosted: HostedSession) -> None:
        self.hosting.wake(hosted)

    def wait_for_exit(
        self, proc: psutil.Process, bound: float, on_exit: Callable[[], None],
        on_stuck: Callable[[str], None],
    ) -> HolderWait:  # fmt: skip
        return HolderWait(self.loop, proc, bound, on_exit, on_stuck)

    def unwatch_worker(self, worker: WorkerProcess) -> None:
        """Nothing left to do: the pidfd reader went at the death, the channel at its end."""

    def call_at(self, when: float, callback: Callable[[], None]) -> object:
        return self.loop.call_at(when, callback)  # loop.time() is time.monotonic()

    def cancel(self, timer: object) -> None:
        if isinstance(timer, asyncio.TimerHandle | HolderWait):
            timer.cancel()

    def _finish(self, watch: WorkerWatch) -> None:
        """The worker died and its channel ended: the session moves on."""
        watch.hosted.on_exit()
        self.hosting.on_exit(watch.hosted, watch.worker.pid, watch.hosted.exit_code or 0)
        self._check_done()

    # -- running -----------------------------------------------------------------------

    def run(self, on_listening: Callable[[], None] = lambda: None) -> int:
        """Serve until SIGTERM or SIGINT; then stop every worker and return 0."""
        try:
            home_fd = claim_home(self.home)
        except BaseException:
            self.loop.close()
            raise
        try:
            # The database first: while serve waits for one (--store-wait), a SIGTERM or a
            # ^C ends it at once (nothing started yet). Then the handlers, before the
            # socket: a SIGTERM sent as soon as it appears must find them (it is handled
            # once the loop runs, after everything below is set up).
            sessions = hosted_sessions(self.config, self.home, self.report)
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.loop.add_signal_handler(sig, self._on_signal)
            if self.config.cluster is not None:
                sessions = self._join_cluster(self.config.cluster)
            elif self.config.listen is not None:
                raise ServeError("--listen needs --cluster URL and --node NAME")
            prepare_workers(self.config, self.loop, self.report)  # warm-up, templates
            self._listener.open()
            on_listening()  # serve's HTTP port: no call reaches it before this socket listens
            self.hosting.open_metrics()
            self.hosting.begin()
            self._host_existing(sessions)
            self.loop.call_soon(self._start_some)
            self.loop.run_until_complete(self._done)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.loop.remove_signal_handler(sig)
            if self.gateway is not None:  # its thread reports into the loop: ended first
                self.gateway.close()
            self.hosting.close()
            close_templates()  # after the workers: each template killed and reaped
            close_spares()
            self._listener.close()
            for client in list(self.clients):
                client.abort()
            for task in self._tasks:
                task.cancel()  # connections still being set up
            self.loop.run_until_complete(asyncio.sleep(0))  # let the transports close
            if self.cluster is not None:  # its threads end before the loop they call into
                self.cluster.close()
            self.loop.close()
            os.close(home_fd)
        return 0

    def _host_existing(self, sessions: list[str]) -> None:
        """Host every session found: those an operator stopped stay STOPPED, the rest start
        (or rest IDLE when hibernation is on, to start at their first use)."""
        initial = self.hosting.initial_states(sessions)
        for session_id, state in initial.items():
            try:
                spec = self._spec(session_id)
            except UnknownApp as exc:
                raise ServeError(str(exc)) from exc
            hosted = self._host(spec, state or State.STOPPED)
            if state is None:
                self._to_start.append(hosted)

    def _join_cluster(self, url: str) -> list[str]:
        """Register this node and claim its sessions (quarantining the others); those it serves."""
        from supervisor.daemon.cluster_node import DaemonNode  # noqa: PLC0415 - --cluster only
        from supervisor.gateway.tcp_handover import TcpHandover  # noqa: PLC0415 - --cluster only
        from supervisor.gateway.tls_gateway import open_gateway  # noqa: PLC0415 - --cluster only
        from supervisor.node.serving import ServingNode  # noqa: PLC0415 - --cluster only

        if self.config.node is None:
            raise ServeError("--cluster needs --node NAME")
        self.gateway = open_gateway(
            self.config.listen, self.config.tls, self.config.node, self._listener.path,
            self.report_from_thread, TcpHandover(self.loop, self.sessions, self.tenants),
        )  # fmt: skip
        serving = ServingNode(
            url, self.config.node, self.home, ttl=self.config.lease_ttl, store=self.config.store,
            address=self.config.listen, tls=self.config.tls,
        )  # fmt: skip
        self.cluster = DaemonNode(
            self.loop, serving, self.sessions, self.report, lambda: self._shutting_down,
            self._check_done,
        )  # fmt: skip
        self.cluster.host = lambda sid, args: self._host(self._spec(sid, cluster=args))
        self.cluster.intent = self.hosting.intent
        return self.cluster.start()

    def report_from_thread(self, line: str) -> None:
        self.loop.call_soon_threadsafe(self.report, line)

    def report(self, line: str) -> None:
        """One line on stderr for the operator (serve's output is its log). It never blocks
        the loop: a reader that stops reading gets its lines dropped and counted
        (supervisor/hosting/daemon_output.py)."""
        self.hosting.output.line(f"loopd serve: {line}")

    def _start_some(self) -> None:
        """Start a few sessions a loop turn, so the control socket answers a mass start."""
        for _ in range(min(STARTS_PER_TURN, len(self._to_start))):
            hosted = self._to_start.popleft()
            if hosted.state is State.STOPPED and not self._shutting_down:
                hosted.start()
        if self._to_start:
            self.loop.call_soon(self._start_some)
        else:
            self.hosting.all_started()

    def _check_done(self) -> None:
        idle = self.cluster is None or self.cluster.idle()  # etcd jobs end by their deadline
        if self._shutting_down and self._all_down() and idle and not self._done.done():
            self._done.set_result(None)

    def _all_down(self) -> bool:
        return all(h.worker is None for h in self.sessions.values())

    def _on_signal(self) -> None:
        if not self._shutting_down:
            self._shutting_down = True
            close_spares()  # none is needed now, nor made again while the workers stop
            self.hosting.stopping()
            self._listener.close()
            for hosted in self.sessions.values():
                if hosted.state is not State.IDLE:  # a hibernated session has nothing to stop
                    hosted.stop()
        self._check_done()

    def _spec(
        self,
        session_id: str,
        *,
        create: bool = False,
        slot: int = 0,
        cluster: WorkerCluster | None = None,
    ) -> WorkerSpec:
        if cluster is None and self.cluster is not None:
            cluster = self.cluster.worker_args(session_id)
        app = self.hosting.intent.app_of(session_id)
        return worker_spec(
            self.config, session_id, app=app, create=create, slot=slot, cluster=cluster
        )

    def host_stopped(self, session_id: str) -> HostedSession:
        return self._host(self._spec(session_id))

    def _host(self, spec: WorkerSpec, state: State = State.STOPPED) -> HostedSession:
        hosted = HostedSession(
            self, spec, self.config.policy(), self.rng, hang_timeout=spec.hang_timeout,
            poison_after=self.config.poison_after, state=state,
        )  # fmt: skip
        self.sessions[spec.session] = hosted
        return hosted

    # -- the control socket ---------------------------------------------------------------

    def _on_client(self, sock: socket.socket) -> None:
        client = ClientConnection(sock, self)
        client.on_end = self._client_closed
        self.clients.add(client)
        connect(self.loop, client, self._tasks, lambda _exc: self.clients.discard(client))

    def _client_closed(self, client: ClientConnection) -> None:
        self.clients.discard(client)
        self.hosting.events.followers.discard(client)

    # -- used by operations -------------------------------------------------------------

    def create_session(
        self, waiter: Waiter, session_id: str, slot: int, app: str | None = None
    ) -> None:
        directory = os.path.join(self.home, SESSIONS_DIR, session_id)
        if session_id in self.sessions or os.path.exists(directory):
            waiter.client.reply(
                error(waiter.request_id, "exists", f"{directory}: session already exists")
            )
        elif app is not None and app not in self.config.apps:
            known = ", ".join(sorted(self.config.apps)) or "none"
            waiter.client.reply(error(waiter.request_id, "unknown_app", (
                f"no App named {app!r} in loopd.toml's [apps] (configured: {known})")))  # fmt: skip
        elif self.cluster is None:
            self._create_hosted(waiter, session_id, slot, None, app)
        elif not self.cluster.refuse_busy(waiter, session_id):  # placed in etcd first, off the loop
            self.cluster.place(
                waiter,
                session_id,
                lambda args: self._create_hosted(waiter, session_id, slot, args, app),
            )

    def _create_hosted(
        self,
        waiter: Waiter,
        session_id: str,
        slot: int,
        cluster: WorkerCluster | None,
        app: str | None,
    ) -> None:
        try:
            self.hosting.intent.set_app(session_id, app)  # durable before the worker runs
        except IntentError as exc:
            waiter.client.reply(error(waiter.request_id, "intent", f"{exc}; nothing was done"))
            return
        hosted = self._host(self._spec(session_id, create=True, slot=slot, cluster=cluster))
        hosted.ready_waiters.append(waiter)
        hosted.start()

    def adopt_session(self, waiter: Waiter, session_id: str, app: str | None = None) -> None:
        """Claim a session whose files were moved here (cluster mode: and serve it)."""
        if self.cluster is None:
            adopt_local(self, waiter, session_id, app)  # restored: listed STOPPED
        else:
            self.cluster.adopt(
                waiter, session_id, lambda c: self._host(self._spec(session_id, cluster=c))
            )

    def move_step(self, waiter: Waiter, op: str, session_id: str, fields: Message) -> None:
        if self.cluster is None:
            waiter.client.reply(error(waiter.request_id, "bad_request", "not a cluster node"))
        else:
            self.cluster.move_step(waiter, op, session_id, fields)

    def forget_session(self, waiter: Waiter, session_id: str) -> None:
        """Stop listing a stopped session whose files left this node (or were deleted)."""
        if self.cluster is None:
            forget_local(self, waiter, session_id)  # its intent entry too
        else:
            self.cluster.forget(waiter, session_id, self.hosting.intent)  # its entry too
        if session_id not in self.sessions:
            self.hosting.timers.forget(session_id)  # its schedules file too

    def forget_pending_start(self, hosted: HostedSession) -> None:
        """An operator acted on a session not yet started at launch: their word wins."""
        if hosted in self._to_start:
            self._to_start.remove(hosted)

    def statuses(self) -> list[Message]:
        return [h.status() for _, h in sorted(self.sessions.items())]

    def daemon_status(self) -> Message:
        return {
            "pid": os.getpid(),
            "clients": len(self.clients),
            "accept_exhausted": self._listener.exhausted,
            "event_followers": len(self.hosting.events.followers),
        }

    def remember_intent(self, session_id: str, *, stopped: bool) -> str | None:
        """Keep an operator's stop (or start) across restarts; the problem, if it cannot.
        Fsynced in the loop before the reply (rare, never on the data path)."""
        try:
            self.hosting.intent.mark(session_id, stopped=stopped)
        except IntentError as exc:
            hosted = self.sessions.get(session_id)
            if not stopped or hosted is None:
                return f"{exc}; nothing was done"
            # A stop is done even when it cannot be kept (a full disk, which the session
            # may be filling): only a restart of serve would start the session again.
            hosted.last_error = f"stopped, but not kept across a restart of serve: {exc}"
            self.report(f"session {session_id}: {hosted.last_error}")
        return None

    def follow_events(self, client: Client) -> bool:
        if not isinstance(client, ClientConnection):
            return False
        self.hosting.events.followers.add(client)
        return True

    def metrics_text(self) -> str:
        return self.hosting.metrics.render()

    def is_running(self, session_id: str) -> bool:
        hosted = self.sessions.get(session_id)
        return hosted is not None and hosted.state is State.RUNNING
