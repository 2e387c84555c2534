"""``loopd serve``: one supervisor per home, one worker per session, one selector loop.

Deaths are noticed through each worker's pidfd becoming readable; timers exist only for
backoff and stop deadlines, so an idle supervisor sleeps in ``select`` with no timeout.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import random
import selectors
import signal
import socket
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from supervisor.errors import HomeLocked
from supervisor.hosted import HostedSession, Waiter
from supervisor.operations import dispatch
from supervisor.spawn import StartMethod, WorkerProcess, WorkerSpec
from supervisor.states import RestartPolicy, State
from worker.errors import InvalidSessionId, SessionLocked
from worker.layout import SESSIONS_DIR
from worker.lock import lock_directory
from worker.session_id import validate_session_id
from worker.wire import Channel, Message, WireError, error

SOCKET_NAME: Final = "loopd.sock"
STARTS_PER_TURN: Final = 8
_PEERCRED: Final = struct.Struct("3i")  # pid, uid, gid


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeConfig:
    """Settings of one ``loopd serve``."""

    home: str
    app: str | None = None
    budget: int | None = None
    max_restarts: int = 5
    window: float = 10.0
    backoff_base: float = 0.1
    backoff_cap: float = 5.0
    stable_after: float = 5.0
    seed: int | None = None
    worker_env: dict[str, str] = field(default_factory=dict)
    start_method: StartMethod = StartMethod.FORK

    def policy(self) -> RestartPolicy:
        return RestartPolicy(
            max_restarts=self.max_restarts, window=self.window, base=self.backoff_base,
            cap=self.backoff_cap, stable_after=self.stable_after,
        )  # fmt: skip


class ClientConnection:
    """One control connection (a peer of our own uid)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.settimeout(5.0)  # a client that stops reading cannot stall the daemon for long
        self.channel = Channel(sock)

    def reply(self, message: Message) -> None:
        if self.channel.closed:
            return
        try:
            self.channel.send(message)
        except (OSError, WireError):
            self.channel.close()


class Supervisor:
    """The daemon: control socket, hosted sessions, and the loop that serves them."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.home = os.path.abspath(config.home)
        self.selector = selectors.DefaultSelector()
        self.sessions: dict[str, HostedSession] = {}
        self.rng = random.Random(config.seed)
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._cancelled: set[int] = set()
        self._counter = itertools.count()
        self._shutting_down = False
        self._home_fd: int | None = None
        self._listener: socket.socket | None = None
        self._to_start: deque[HostedSession] = deque()

    # -- the Loop protocol of HostedSession ---------------------------------------------

    def watch_worker(self, hosted: HostedSession, worker: WorkerProcess) -> None:
        self.selector.register(worker.pidfd, selectors.EVENT_READ, hosted.on_exit)
        self.selector.register(
            worker.channel, selectors.EVENT_READ,
            lambda: self._on_worker_channel(hosted, worker),
        )  # fmt: skip

    def unwatch_worker(self, worker: WorkerProcess) -> None:
        self.selector.unregister(worker.pidfd)
        # The channel is unregistered at its end of stream, unless the final drain in
        # on_exit saw that end first: then it is still registered here.
        with contextlib.suppress(KeyError):
            self.selector.unregister(worker.channel)

    def call_at(self, when: float, callback: Callable[[], None]) -> object:
        ticket = next(self._counter)
        heapq.heappush(self._timers, (when, ticket, callback))
        return ticket

    def cancel(self, timer: object) -> None:
        if isinstance(timer, int):
            self._cancelled.add(timer)

    def _on_worker_channel(self, hosted: HostedSession, worker: WorkerProcess) -> None:
        hosted.on_channel_readable(worker.channel)
        if worker.channel.closed:
            # End of stream: stop watching the socket; the pidfd reports the death.
            self.selector.unregister(worker.channel)

    # -- running -----------------------------------------------------------------------

    def run(self) -> int:
        """Serve until SIGTERM or SIGINT; then stop every worker and return 0."""
        os.makedirs(os.path.join(self.home, SESSIONS_DIR), mode=0o700, exist_ok=True)
        try:
            self._home_fd = lock_directory(self.home)
        except SessionLocked as exc:
            raise HomeLocked(self.home, exc.pid) from exc
        wake_read, wake_write = socket.socketpair()
        wake_read.setblocking(False)
        wake_write.setblocking(False)
        previous = signal.set_wakeup_fd(wake_write.fileno(), warn_on_full_buffer=False)
        handlers = {
            sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            self._listen()
            self.selector.register(
                wake_read, selectors.EVENT_READ, lambda: self._on_signal(wake_read)
            )
            # Started a few per loop turn, so the control socket answers during a mass start.
            self._to_start.extend(self._host(self._spec(s)) for s in self._existing_sessions())
            self._loop()
        finally:
            signal.set_wakeup_fd(previous)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            wake_read.close()
            wake_write.close()
            self._close_listener()
            os.close(self._home_fd)
        return 0

    def _loop(self) -> None:
        while not (self._shutting_down and self._all_down()):
            timeout = None
            while self._timers and self._timers[0][1] in self._cancelled:
                self._cancelled.discard(heapq.heappop(self._timers)[1])
            if self._timers:
                timeout = max(0.0, self._timers[0][0] - time.monotonic())
            if self._to_start:
                timeout = 0.0
                for _ in range(min(STARTS_PER_TURN, len(self._to_start))):
                    hosted = self._to_start.popleft()
                    if hosted.state is State.STOPPED and not self._shutting_down:
                        hosted.start()
            for key, _events in self.selector.select(timeout):
                if self.selector.get_map().get(key.fd) is not key:
                    # An earlier callback of this batch unregistered (and closed) this
                    # file: a worker's pidfd and its channel's end of stream often land in
                    # one batch, and reaping the worker closes the channel. The event is
                    # stale; its fd number may already belong to someone else.
                    continue
                callback: Callable[[], None] = key.data
                callback()
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                _when, ticket, callback = heapq.heappop(self._timers)
                if ticket in self._cancelled:
                    self._cancelled.discard(ticket)
                else:
                    callback()

    def _all_down(self) -> bool:
        return all(h.worker is None for h in self.sessions.values())

    def _on_signal(self, wake: socket.socket) -> None:
        try:
            wake.recv(4096)
        except BlockingIOError:
            return
        if not self._shutting_down:
            self._shutting_down = True
            self._close_listener()
            for hosted in self.sessions.values():
                hosted.stop()

    def _spec(self, session_id: str, *, create: bool = False, slot: int = 0) -> WorkerSpec:
        return WorkerSpec(
            home=self.home, session=session_id, create=create, slot=slot, app=self.config.app,
            budget=self.config.budget, extra_env=dict(self.config.worker_env),
            start_method=self.config.start_method,
        )  # fmt: skip

    def _host(self, spec: WorkerSpec) -> HostedSession:
        hosted = HostedSession(self, spec, self.config.policy(), self.rng)
        self.sessions[spec.session] = hosted
        return hosted

    def _existing_sessions(self) -> list[str]:
        found = []
        for name in sorted(os.listdir(os.path.join(self.home, SESSIONS_DIR))):
            try:
                found.append(validate_session_id(name))
            except InvalidSessionId:
                continue  # not a session directory (the operator's own files)
        return found

    # -- the control socket ---------------------------------------------------------------

    def _listen(self) -> None:
        path = os.path.join(self.home, SOCKET_NAME)
        # Bound under another name and renamed into place once listening: a client that
        # waits for the socket file never finds one that refuses it (ECONNREFUSED
        # between bind and listen).
        staging = path + ".new"
        for stale in (path, staging):
            if os.path.exists(stale):
                os.unlink(stale)  # we hold the home lock, so no live daemon owns it
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # the socket is born 0600: no window where it is wider
        try:
            listener.bind(staging)
        finally:
            os.umask(old_umask)
        os.chmod(staging, 0o600)
        listener.listen(64)
        os.rename(staging, path)
        listener.setblocking(False)
        self._listener = listener
        self.selector.register(listener, selectors.EVENT_READ, self._on_accept)

    def _close_listener(self) -> None:
        if self._listener is not None:
            self.selector.unregister(self._listener)
            self._listener.close()
            self._listener = None
            path = os.path.join(self.home, SOCKET_NAME)
            if os.path.exists(path):
                os.unlink(path)

    def _on_accept(self) -> None:
        assert self._listener is not None
        try:
            sock, _addr = self._listener.accept()
        except BlockingIOError:
            return
        _pid, uid, _gid = _PEERCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        )
        if uid != os.getuid():
            sock.close()  # peers of another uid are refused
            return
        client = ClientConnection(sock)
        self.selector.register(
            client.channel, selectors.EVENT_READ, lambda: self._on_client(client)
        )

    def _on_client(self, client: ClientConnection) -> None:
        try:
            messages = client.channel.read_nowait()
        except (WireError, OSError) as exc:
            client.reply(error(None, "bad_frame", str(exc)))
            self.selector.unregister(client.channel)
            client.channel.close()
            return
        for message in messages:
            self._dispatch(client, message)
        if client.channel.closed:
            self.selector.unregister(client.channel)
            client.channel.close()

    def _dispatch(self, client: ClientConnection, message: Message) -> None:
        dispatch(self, client, message)

    # -- used by operations -------------------------------------------------------------

    def create_session(self, waiter: Waiter, session_id: str, slot: int) -> None:
        directory = os.path.join(self.home, SESSIONS_DIR, session_id)
        if session_id in self.sessions or os.path.exists(directory):
            waiter.client.reply(
                error(waiter.request_id, "exists", f"{directory}: session already exists")
            )
            return
        hosted = self._host(self._spec(session_id, create=True, slot=slot))
        hosted.ready_waiters.append(waiter)
        hosted.start()

    def forget_pending_start(self, hosted: HostedSession) -> None:
        """An operator acted on a session not yet started at launch: their word wins."""
        if hosted in self._to_start:
            self._to_start.remove(hosted)

    def statuses(self) -> list[Message]:
        return [h.status() for _, h in sorted(self.sessions.items())]

    def is_running(self, session_id: str) -> bool:
        hosted = self.sessions.get(session_id)
        return hosted is not None and hosted.state is State.RUNNING
