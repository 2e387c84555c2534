"""One hosted session: its state machine, its worker, its requests in flight."""

from __future__ import annotations

import dataclasses
import errno
import random
import signal
import time
from collections.abc import Callable
from typing import Final, Protocol

import psutil

from supervisor.hosting.epoch_apps import app_reported, take_stored
from supervisor.scheduling.files import reported_summary
from supervisor.sessions.endpoints import Waiter, WorkerChannel
from supervisor.sessions.exit_advice import fatal_reason, honoured_exit, outage_wait
from supervisor.sessions.hang import HangWatch
from supervisor.sessions.hosted_requests import SessionRequests
from supervisor.sessions.hosted_status import int_or_none, session_status, tokens_reported
from supervisor.sessions.lock_wait import outgoing_worker
from supervisor.sessions.poison import DEFAULT_POISON_AFTER, PoisonLedger
from supervisor.sessions.relay import Relay
from supervisor.sessions.spawn import WorkerProcess, WorkerSpec, describe_exit
from supervisor.states import RestartPolicy, State, StateMachine
from worker.ipc.wire import Message
from worker.process import EXIT_CLEAN, EXIT_LOCKED, EXIT_REFUSED, bounded

STOP_DEADLINE: Final = 5.0
_SHORTAGE: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM})
MAX_LAST_ERROR: Final = 4000
"""Characters of ``last_error``: the worker's words (at most 2,000) and our next step."""


class Loop(Protocol):
    """What a hosted session needs from the event loop."""

    def watch_worker(self, hosted: HostedSession, worker: WorkerProcess) -> WorkerChannel: ...
    def unwatch_worker(self, worker: WorkerProcess) -> None: ...
    def call_at(self, when: float, callback: Callable[[], None]) -> object: ...
    def cancel(self, timer: object) -> None: ...
    def on_move(self, hosted: HostedSession, old: State, new: State) -> None: ...
    def on_report(self, hosted: HostedSession, message: Message) -> None: ...
    def wait_for_exit(
        self, proc: psutil.Process, bound: float, on_exit: Callable[[], None],
        on_stuck: Callable[[str], None],
    ) -> object: ...  # fmt: skip
    def wake(self, hosted: HostedSession) -> None: ...


class HostedSession(SessionRequests):
    """A session the supervisor hosts; every state change goes through its StateMachine."""

    def __init__(
        self,
        loop: Loop,
        spec: WorkerSpec,
        policy: RestartPolicy,
        rng: random.Random,
        *,
        hang_timeout: float | None = None,
        poison_after: int = DEFAULT_POISON_AFTER,
        state: State = State.STOPPED,
    ) -> None:
        self.loop = loop
        self.spec = spec
        self.id = spec.session
        self.machine = StateMachine(spec.session, state, lambda a, b: loop.on_move(self, a, b))
        self.policy = policy
        self.rng = rng
        self.worker: WorkerProcess | None = None
        self.link: WorkerChannel | None = None
        self.hang = HangWatch(loop, hang_timeout, self._hung, self._last_beat)
        self.poison = PoisonLedger(poison_after)
        self.restarts = 0
        self.started_at: float | None = None
        self._last_error: str | None = None
        self._said: str | None = None  # why the current worker says it exits, if it said
        self._holder: int | None = None  # who holds the lock the current worker found held
        self._kind: str | None = None  # what kind of damage its refusal was, if it said
        self._reported: object = None  # the code its "exiting" message gave, if any
        self._hang_kill = False  # the current worker was killed as hung by this daemon
        self.epoch: int | None = None
        self.records: int | None = None
        # The worker's [pending, next due], as it last said, or as the daemon's file says.
        self.schedules: object = reported_summary(spec.home, spec.session)
        self.tokens: int | None = None  # its worker's Usage tokens, as it last reported
        # In a database: as serve read it at start, then as its workers report it.
        self.epoch_app = take_stored(spec.store, spec.session)
        self.relay = Relay(spec.session)
        self.queued: list[tuple[Waiter, Message]] = []
        self.ready_waiters: list[Waiter] = []
        self.stop_waiters: list[Waiter] = []
        self.restart_after_stop = False
        self.hibernating = False  # stopping to rest IDLE (supervisor.hosting decides when)
        self.exit_pid: int | None = None
        self.exit_code: int | None = None
        self._timer: object | None = None

    @property
    def state(self) -> State:
        return self.machine.state

    @property
    def in_flight(self) -> Relay:
        """Relayed requests awaiting the worker's reply."""
        return self.relay

    @property
    def app(self) -> str | None:
        return self.spec.app

    @property
    def last_error(self) -> str | None:
        """Why the last worker ended, and what to do; bounded so a status row stays small."""
        return self._last_error

    @last_error.setter
    def last_error(self, why: str | None) -> None:
        self._last_error = None if why is None else bounded(why, MAX_LAST_ERROR)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the worker (from STOPPED, EXITED, FATAL or BACKOFF)."""
        self._cancel_timer()
        self.exit_pid = self.exit_code = None
        self.machine.move(State.STARTING)
        self._said, self._kind, self._hang_kill = None, None, False
        self._reported = None
        poisoned = self.poison.poisoned()
        if poisoned != self.spec.poisoned:
            self.spec = dataclasses.replace(self.spec, poisoned=poisoned)
        self._holder = None
        try:
            worker = WorkerProcess(self.spec)
        except OSError as exc:
            self.last_error = f"could not start the worker: {exc}"
            self.started_at = None  # no run began: an old run's length resets no backoff
            self._crashed(time.monotonic(), started=False, shortage=exc.errno in _SHORTAGE)
            return
        self.worker = worker
        self.started_at = time.monotonic()
        self.hang.heard()
        self.link = self.loop.watch_worker(self, worker)
        deadline = self.started_at + self.policy.start_timeout
        self._timer = self.loop.call_at(deadline, self._start_overdue)

    def operator_start(self) -> None:
        """An explicit start: forget the restart history, then start."""
        self.policy.reset()
        self.last_error = None
        self.start()

    def stop(self, *, restart: bool = False) -> None:
        """SIGTERM the worker's group, SIGKILL it at the deadline; STOPPED when reaped."""
        self.restart_after_stop = restart
        if self.state in (State.BACKOFF, State.EXITED, State.FATAL, State.IDLE):
            self._cancel_timer()
            self.machine.move(State.STOPPED)
            self._fail_waiting("stopped", f"session {self.id} was stopped", restarting=restart)
        if self.state is State.STOPPED:
            self._answer_stop_waiters()
            if restart:
                self.restart_after_stop = False
                self.operator_start()
            return
        if self.state is State.STOPPING:
            return  # already on its way down; the exit answers the waiters
        self.machine.move(State.STOPPING)
        worker = self.worker
        if worker is not None:
            worker.signal_group(signal.SIGTERM)
            self._cancel_timer()  # a start deadline gives way to the stop's
            self._timer = self.loop.call_at(time.monotonic() + STOP_DEADLINE, self._kill_worker)

    # -- events from the worker --------------------------------------------------------

    def on_worker_broke_protocol(self, why: str) -> None:
        self.kill_for(f"bad frame from worker: {why}")

    def kill_for(self, why: str) -> None:
        """SIGKILL the worker; ``why`` is the reason on_exit gives for its death."""
        self._said = bounded(why)
        if self.worker is not None:
            self.worker.kill()

    def on_worker_message(self, message: Message) -> None:
        self.hang.heard()  # any message shows that the worker's loop turns
        op = message.get("op")
        if op == "state":
            self._take_state(message.get("state"))
            self.tokens = tokens_reported(message.get("stats"))
            self.loop.on_report(self, message)
        elif op == "ready":
            self._take_state(message)
            if self.state is State.STARTING:
                self._cancel_timer()  # the start deadline
                self.policy.on_ready()
                self.machine.move(State.RUNNING)
                self.spec = self.spec.opened()
                for waiter in self.ready_waiters:
                    waiter.client.reply(
                        {"id": waiter.request_id, "ok": True, "result": self.status()}
                    )
                self.ready_waiters.clear()
                self.hang.arm()
                queued, self.queued = self.queued, []
                for waiter, request in queued:
                    self._act(waiter, request)
        elif op == "exiting":
            # Bounded again here: a worker of another version may send any length.
            self._said = bounded(str(message.get("message")))
            holder = message.get("holder")
            if message.get("code") == "locked" and type(holder) is int:
                self._holder = holder
            self._kind = kind if isinstance(kind := message.get("kind"), str) else None
            self._reported = message.get("code")
        else:
            result = message.get("result")
            if isinstance(result, dict):
                self._take_state(result.get("state"))
            self.relay.answer(int_or_none(message.get("id")), message)

    def on_exit(self) -> None:
        """The pidfd says the worker died: reap, answer what was in flight, decide."""
        worker = self.worker
        assert worker is not None
        # What the worker said before dying (its "exiting" reason, late replies) has been
        # read already: the loop calls this only after its channel's end of stream.
        said = self._said
        started = self.state is not State.STARTING  # it said ready before it ended
        code = worker.reap()
        self.exit_pid, self.exit_code = worker.pid, code
        turn_started, turn_keys = worker.heartbeat.turn()  # what it was handling, if any
        raced = self._hang_kill and self.hang.progressed_since_verdict()
        self.loop.unwatch_worker(worker)
        worker.close()
        self.worker = None
        self.link = None
        self._cancel_timer()
        self.hang.cancel()
        now = time.monotonic()
        how = describe_exit(code)
        self._fail_in_flight(
            "worker_died",
            f"the worker of session {self.id} died ({how}) while the request was in flight; "
            "it may or may not have been applied: retry with the same key",
        )
        if self.state is State.STOPPING and self.hibernating:
            self.hibernating = False
            self.machine.move(State.IDLE)
            if self.queued or self.ready_waiters:
                self._wake()  # used again while it was stopping
            return
        if self.state is State.STOPPING:
            self.machine.move(State.STOPPED)
            restarting = self.restart_after_stop  # a restart: they wait for the new worker
            self._fail_waiting("stopped", f"session {self.id} was stopped", restarting=restarting)
            self._answer_stop_waiters()
            if self.restart_after_stop:
                self.restart_after_stop = False
                self.operator_start()
            return
        acted = honoured_exit(code, self._reported)  # an App's os._exit(4) is a crash
        if acted == EXIT_LOCKED and self._wait_for_holder():
            return
        fatal = fatal_reason(acted, said, self.spec.home, self.id, self._holder, self._kind,
                             stored=bool(self.spec.store))  # fmt: skip
        if fatal is not None:
            if acted == EXIT_REFUSED:  # the counts of a log that is refused mean nothing now
                self.epoch = self.records = None
            self._fatal(fatal)
        elif acted == EXIT_CLEAN:
            self.machine.move(State.EXITED)
            self._fail_waiting("exited", f"the worker of session {self.id} exited")
        elif (waiting := outage_wait(acted, self.spec.home, said)) is not None:
            # The store is out (a primary lost before its standby is promoted, a full
            # disk): every session of the node meets it, and none is at fault. Started
            # again until it is over, never FATAL for it (docs/scaling.md, operations.md).
            said = f"worker {how}" + (f": {said}" if said else "")
            self.last_error = f"{said} -- {waiting}"
            self.restarts += 1
            self.machine.move(State.BACKOFF)
            self._timer = self.loop.call_at(now + self.policy.outage_delay(self.rng), self.start)
        else:
            # Only this worker's words: the previous exits' are not chained on, or the
            # text would grow with every restart.
            self.last_error = f"worker {how}" + (f": {said}" if said else "")
            if turn_keys:
                running = None if turn_started is None else now - turn_started
                charged = self.poison.charged(turn_keys, running, progressing=raced)
                self.last_error = f"{self.last_error}{charged}"
            self._crashed(now, started=started)

    def _crashed(self, now: float, *, started: bool, shortage: bool = False) -> None:
        if shortage:  # serve's own descriptors or processes: not the session's failed start
            self.last_error = f"{self.last_error} -- serve is short of it: started again"
            self.machine.move(State.BACKOFF)
            self._timer = self.loop.call_at(now + self.policy.outage_delay(self.rng), self.start)
            return
        if not started and self.policy.start_failed():
            # However long each start took: a restart window counts nothing of a start
            # that takes longer than the window allows for (an App's slow import).
            self._fatal(
                f"{self.policy.failed_starts} starts in a row ended before the worker was "
                f"ready (--start-retries {self.policy.start_retries}); last: "
                f"{self.last_error}. Next: fix the cause, then `loopd start {self.id}`"
            )
            return
        if self.started_at is not None and now - self.started_at >= self.policy.stable_after:
            self.policy.on_stable()
        delay = self.policy.next_delay(now, self.rng)
        if delay is None:
            self._fatal(
                f"more than {self.policy.max_restarts} restarts in {self.policy.window:g} s; "
                f"last: {self.last_error}. Next: fix the cause, then `loopd start {self.id}`"
            )
            return
        self.restarts += 1
        self.machine.move(State.BACKOFF)
        if delay == 0 and started:
            self.start()
        else:  # a start that failed to spawn is tried again from the loop, never nested
            self._timer = self.loop.call_at(now + delay, self.start)

    def _wait_for_holder(self) -> bool:
        """The lock is held by an earlier worker (a previous supervisor's, or one forked by a
        template that died before it answered), finishing its last batch:
        wait for it to exit (BACKOFF, bounded by the hang timeout), then start. False if
        the holder is anything else (not ours: not fighting it)."""
        holder = self._holder
        current = self.worker.pid if self.worker is not None else None
        proc = outgoing_worker(holder, self.id, current) if holder is not None else None
        if proc is None:
            return False
        bound = self.hang.timeout if self.hang.timeout is not None else STOP_DEADLINE
        self.last_error = (
            f"the session is locked by pid {holder}, an earlier worker of it (a previous "
            f"supervisor's, or one a template forked before it died) finishing its last "
            f"batch: waiting up to {bound:g} s for it to exit"
        )
        self.machine.move(State.BACKOFF)
        self._timer = self.loop.wait_for_exit(proc, bound, self._holder_gone, self._fatal)
        return True

    def _holder_gone(self) -> None:
        self._timer = None
        if self.state is State.BACKOFF:
            self.last_error = None
            self.start()

    def _fatal(self, why: str) -> None:
        self.last_error = why
        self.machine.move(State.FATAL)
        self._fail_waiting("fatal", f"session {self.id} is FATAL: {why}")

    def _start_overdue(self) -> None:
        """The worker did not say ready within --start-timeout: a failed start."""
        self._timer = None
        if self.state is State.STARTING and self.worker is not None:
            self.kill_for(
                f"start: not ready within {self.policy.start_timeout:g} s (--start-timeout); "
                "killed (an App import or factory that never returns?)"
            )

    def _wake(self) -> None:
        self.loop.wake(self)

    def _kill_worker(self) -> None:
        if self.worker is not None:
            self.worker.kill()

    def _last_beat(self) -> float:
        return self.worker.heartbeat.last() if self.worker is not None else 0.0

    def _hung(self, silent: float) -> None:
        """No message within the hang timeout: the worker's loop is stuck (or stopped)."""
        if self.state is not State.RUNNING or self.worker is None:
            return
        self.kill_for(
            f"hang: no heartbeat for {silent:.1f} s (--hang-timeout {self.hang.timeout:g}); killed"
        )
        self._hang_kill = True

    def _take_state(self, state: object) -> None:
        if isinstance(state, dict):
            self.epoch = int_or_none(state.get("epoch"))
            self.records = int_or_none(state.get("records"))
            self.schedules = state.get("schedules")
            self.epoch_app = app_reported(state) or self.epoch_app

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self.loop.cancel(self._timer)
            self._timer = None

    def status(self) -> Message:
        return session_status(self)
