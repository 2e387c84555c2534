"""A hosted session's requests: acted on, queued while its worker starts, or refused."""

from __future__ import annotations

from typing import Final

from supervisor.sessions.endpoints import Waiter, WorkerChannel
from supervisor.sessions.handover import hand_over
from supervisor.sessions.relay import Relay
from supervisor.sessions.spawn import WorkerProcess
from supervisor.states import State
from worker.ipc.wire import Message, error

MAX_QUEUED: Final = 1000


class SessionRequests:
    """The request side of ``HostedSession`` (which holds the state it reads)."""

    id: str
    relay: Relay
    link: WorkerChannel | None
    worker: WorkerProcess | None
    epoch: int | None
    queued: list[tuple[Waiter, Message]]
    ready_waiters: list[Waiter]
    stop_waiters: list[Waiter]
    hibernating: bool
    restart_after_stop: bool

    @property
    def state(self) -> State:
        raise NotImplementedError

    @property
    def last_error(self) -> str | None:
        raise NotImplementedError

    def status(self) -> Message:
        raise NotImplementedError

    def _wake(self) -> None:
        raise NotImplementedError

    def submit(self, waiter: Waiter, request: Message) -> None:
        """Act on a request now, queue it while the worker starts, or refuse it."""
        if self.state is State.RUNNING:
            self._act(waiter, request)
        elif (
            self.state in (State.STARTING, State.BACKOFF, State.IDLE)
            or (self.state is State.STOPPING and (self.hibernating or self.restart_after_stop))
        ) and len(self.queued) < MAX_QUEUED:
            self.queued.append((waiter, request))
            if self.state is State.IDLE:
                self._wake()  # on demand: the request waits for the start
        else:
            detail = f": {self.last_error}" if self.last_error else ""
            why = f"session {self.id} is {self.state.value}{detail}"
            waiter.client.reply(error(waiter.request_id, "unavailable", why))

    def _act(self, waiter: Waiter, request: Message) -> None:
        if request.get("op") == "connect":
            self.connect(waiter)
        else:
            self.forward(waiter, request)

    def forward(self, waiter: Waiter, request: Message) -> None:
        """Relay a request to the worker; exactly one reply reaches the waiter."""
        assert self.link is not None
        self.relay.forward(self.link, waiter, request)

    def connect(self, waiter: Waiter) -> None:
        """Give the client a connection of its own to the worker (the direct data path);
        one that has begun to exit gets none: the next worker does (or the client hears
        why there is none), as while a worker starts."""
        assert self.link is not None
        assert self.worker is not None
        if self.worker.exiting() and len(self.queued) < MAX_QUEUED:
            # Its death is on its way (pidfd, end of channel): a client that saw its own
            # connection end asks again before that, and a connection handed over now
            # would die unread with the worker (spawn.WorkerProcess.exiting).
            self.queued.append((waiter, {"op": "connect"}))
            return
        hand_over(self.link, waiter, self.id, self.worker.pid, self.epoch)

    def _fail_in_flight(self, code: str, message: str) -> None:
        self.relay.fail_all(code, message)

    def _fail_waiting(self, code: str, message: str, *, restarting: bool = False) -> None:
        """Fail the requests in flight; and those queued and the ready waiters unless a
        restart keeps them for the new worker."""
        self._fail_in_flight(code, message)
        queued: list[tuple[Waiter, Message]] = []
        ready: list[Waiter] = []
        if not restarting:
            queued, self.queued = self.queued, []
            ready, self.ready_waiters = self.ready_waiters, []
        for waiter in [w for w, _ in queued] + ready:
            waiter.client.reply(error(waiter.request_id, code, message))

    def _answer_stop_waiters(self) -> None:
        waiters, self.stop_waiters = self.stop_waiters, []
        for waiter in waiters:
            waiter.client.reply({"id": waiter.request_id, "ok": True, "result": self.status()})
