"""The daemon's timers for scheduled requests: one per session with something pending.

Fed by the hosted sessions' state changes and their workers' reports (each carries the
worker's ``[pending, next due]``), kept durable in the derived files (``files``), and
armed again from them at start. When a session's next schedule is due, the daemon sends
it ``DELIVER_DUE`` through the ordinary request path (an IDLE session is woken by it, a
starting one holds it until ready) and arms the next timer from the answer; a delivery
that fails (the worker died, the session is unavailable) is tried again with a pause
that doubles up to ``RETRY_MOST``. A STOPPED or FATAL session is not started for it:
its due schedules are delivered when it runs again.

Deliveries that come due together (a restart's catch-up, where every session whose file
says ``live`` or whose schedule came due while no daemon ran is due at once; schedules
made for the same instant) are begun ``DELIVERIES_PER_TURN`` a loop turn: each may wake
a hibernated session, a fork of the daemon, and a burst of them in one turn held the
loop for all of them (47 wakes, 0.3 s, in the timers benchmark's restart) before it
read a control request or the first woken worker's ready. The catch-up wakes the
sessions with a schedule overdue first, the oldest first, and only then the live ones
with nothing known to be due.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Final, Protocol, runtime_checkable

from supervisor.scheduling.delivery import (
    DELIVER_DUE,
    RETRY_FIRST,
    RETRY_MOST,
    failed_keys,
    next_after,
)
from supervisor.scheduling.files import (
    Derived,
    derived_of,
    derived_path,
    derived_sessions,
    read_derived,
    write_derived,
)
from supervisor.states import State
from worker.ipc.wire import Message
from worker.store.errors import SessionError
from worker.store.schedules import parse_time

DELIVERIES_PER_TURN: Final = 8
"""Deliveries begun in one loop turn at most (each may wake a session: a fork)."""
REWRITE_EVERY: Final = 5.0
"""Seconds between attempts at a session's schedules file whose write failed (ENOSPC)."""


class Hosted(Protocol):
    """What the timers see of a hosted session."""

    @property
    def id(self) -> str: ...
    @property
    def state(self) -> State: ...
    @property
    def exit_code(self) -> int | None: ...


@dataclass(slots=True)
class DeliveryWaiter:
    """The waiter of a delivery: the fields of the daemon's ``Waiter`` that a relayed
    request uses (the daemon layer is above this one)."""

    client: _Answer
    request_id: object
    sock: None = None


@runtime_checkable
class Deliverable(Protocol):
    """A hosted session that takes requests (``HostedSession.submit``)."""

    def submit(self, waiter: DeliveryWaiter, request: Message) -> None: ...


class _Answer:
    """Where the answer to a delivery goes: back to the timers (a Waiter's client)."""

    def __init__(self, on_answer: Callable[[Message], None]) -> None:
        self._on_answer = on_answer

    def reply(self, message: Message) -> None:
        self._on_answer(message)

    def reply_relayed(self, message: Message) -> None:
        self._on_answer(message)

    def reply_with_fd(self, message: Message, fd: int) -> bool:
        return False


def catch_up_order(catch_up: list[tuple[float, str]]) -> list[str]:
    """The sessions of ``(due time, id)`` pairs in the order a restart wakes them: the
    earliest due first (a live one with nothing overdue is due at infinity), then by id."""
    return [session_id for _when, session_id in sorted(catch_up)]


class ScheduleTimers:
    """One per daemon: which sessions have schedules, and a timer for each."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        home: str,
        sessions: Mapping[str, Hosted],
        report: Callable[[str], None],
    ) -> None:
        self.loop = loop
        self.home = home
        self.sessions = sessions
        self.report = report
        self.known: dict[str, Derived] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._busy: set[str] = set()  # a delivery is in flight
        self._pause: dict[str, float] = {}  # the next retry's pause, after a failure
        self._due: dict[str, None] = {}  # timers that fired, their deliveries not yet begun
        self._draining: asyncio.Handle | None = None  # the next turn's _deliver_some
        self._unwritten: dict[str, Derived] = {}  # files a write failed for: written again
        self._rewrite: asyncio.TimerHandle | None = None
        self.delivered = 0  # requests delivered (applied or found applied)

    def begin(self) -> None:
        """Arm a timer for every derived file; the catch-up is begun in the loop's first
        turns: the sessions with a schedule overdue, the oldest first, then the other
        live ones (their worker may have changed the schedules without a word). The
        sessions are hosted before the loop runs, so each delivery finds its session."""
        now = time.time()
        catch_up: list[tuple[float, str]] = []
        for session_id in derived_sessions(self.home):
            derived = read_derived(self.home, session_id)
            if derived is None:
                continue
            self.known[session_id] = derived
            when = parse_time(derived.next) if derived.next is not None else None
            if when is not None and when <= now:
                catch_up.append((when, session_id))
            elif derived.live:
                catch_up.append((math.inf, session_id))
            else:
                self._arm(session_id)
        for session_id in catch_up_order(catch_up):
            self._fire(session_id)

    def close(self) -> None:
        if self._rewrite is not None:
            self._rewrite.cancel()
            self._rewrite = None
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self._draining is not None:
            self._draining.cancel()
            self._draining = None
        self._due.clear()

    def forget(self, session_id: str) -> None:
        """The session left the daemon's list (deleted, forgotten, moved away): its timer,
        what the daemon knew and its file go (a session created again under the id has
        schedules of its own, and a restart wakes nothing for this one)."""
        timer = self._timers.pop(session_id, None)
        if timer is not None:
            timer.cancel()
        self._due.pop(session_id, None)
        self._pause.pop(session_id, None)
        known = self.known.pop(session_id, None) is not None
        if known or os.path.lexists(derived_path(self.home, session_id)):
            self._store(session_id, Derived(live=False, pending=0, next=None))

    def summary(self, session_id: str) -> list[object]:
        """``[pending, next due]`` as the daemon knows them (status)."""
        known = self.known.get(session_id)
        return [0, None] if known is None else [known.pending, known.next]

    # -- what the daemon hears ---------------------------------------------------------

    def on_move(self, hosted: Hosted, old: State, new: State) -> None:
        session_id = hosted.id
        # What the worker said last (its ready, a reply, the stop's answer) comes first:
        # a stop can overtake the worker's state report.
        self.seen(session_id, getattr(hosted, "schedules", None))
        known = self.known.get(session_id, Derived(live=False, pending=0, next=None))
        if new is State.STARTING and not known.live:
            # From now on its worker may change the schedules faster than it reports.
            self._store(session_id, Derived(live=True, pending=known.pending, next=known.next))
        elif old is State.STOPPING and new in (State.IDLE, State.STOPPED):
            if hosted.exit_code == 0 and known.live:  # its last answer carried the final state
                self._store(session_id, Derived(live=False, pending=known.pending, next=known.next))
        elif new is State.RUNNING and session_id in self.known:
            self._arm(session_id)  # a session that was stopped or FATAL when its time came

    def on_report(self, hosted: Hosted, message: Mapping[str, object]) -> None:
        state = message.get("state")
        if isinstance(state, dict):
            self.seen(hosted.id, state.get("schedules"))

    def seen(self, session_id: str, summary: object) -> None:
        """A worker's ``[pending, next due]``: stored if it changed, the timer armed."""
        known = self.known.get(session_id)
        derived = derived_of(summary, live=True if known is None else known.live)
        if derived is None or derived == known:
            return
        self._store(session_id, derived)
        if session_id not in self._busy:
            self._arm(session_id)

    # -- delivery ------------------------------------------------------------------------

    def _store(self, session_id: str, derived: Derived) -> None:
        try:
            write_derived(self.home, session_id, derived)
        except SessionError as exc:
            # The timer still runs from memory, and the file is written again every
            # REWRITE_EVERY s until it is (a full disk freed): a restart after that finds
            # it. Only a restart before then finds the old file or none.
            if session_id not in self._unwritten:
                self.report(f"session {session_id}: schedules file not written: {exc}; "
                            f"written again every {REWRITE_EVERY:g} s until it is")  # fmt: skip
            self._unwritten[session_id] = derived
            if self._rewrite is None:
                self._rewrite = self.loop.call_later(REWRITE_EVERY, self._write_again)
        else:
            if self._unwritten.pop(session_id, None) is not None:
                self.report(f"session {session_id}: schedules file written")
        if derived.pending or derived.live:
            self.known[session_id] = derived
        else:
            self.known.pop(session_id, None)

    def _write_again(self) -> None:
        """The files a write failed for, each with what the daemon knows of it now."""
        self._rewrite = None
        for session_id, derived in list(self._unwritten.items()):
            self._store(session_id, derived)

    def _arm(self, session_id: str, delay: float | None = None) -> None:
        timer = self._timers.pop(session_id, None)
        if timer is not None:
            timer.cancel()
        if delay is None:
            known = self.known.get(session_id)
            when = parse_time(known.next) if known is not None and known.next else None
            if when is None:
                return
            delay = max(0.0, when - time.time())
        self._timers[session_id] = self.loop.call_later(delay, self._fire, session_id)

    def _fire(self, session_id: str) -> None:
        """A session's timer: its delivery is begun in the next turn that has room."""
        self._timers.pop(session_id, None)
        self._due[session_id] = None
        if self._draining is None:
            self._draining = self.loop.call_soon(self._deliver_some)

    def _deliver_some(self) -> None:
        """Begin the deliveries of up to ``DELIVERIES_PER_TURN`` fired timers, oldest
        first; the rest in the next turns, after the loop has read what is ready."""
        self._draining = None
        for session_id in list(islice(self._due, DELIVERIES_PER_TURN)):
            del self._due[session_id]
            self._deliver(session_id)
        if self._due:
            self._draining = self.loop.call_soon(self._deliver_some)

    def _deliver(self, session_id: str) -> None:
        hosted = self.sessions.get(session_id)
        if session_id in self._busy or not isinstance(hosted, Deliverable):
            return
        if self.sessions[session_id].state in (State.STOPPED, State.FATAL):
            return  # armed again when it runs (on_move)
        self._busy.add(session_id)
        answer = _Answer(lambda message: self._answered(session_id, message))
        request: Message = {"op": "request", "request": dict(DELIVER_DUE)}
        hosted.submit(DeliveryWaiter(answer, f"deliver-{session_id}"), request)

    def _answered(self, session_id: str, message: Message) -> None:
        self._busy.discard(session_id)
        result = message.get("result") if message.get("ok") is True else None
        if not isinstance(result, dict):
            self._retry(session_id)
            return
        delivered = result.get("delivered")
        count = len(delivered) if isinstance(delivered, list) else 0
        self.delivered += count
        self.seen(session_id, [result.get("pending"), result.get("next")])
        upcoming = next_after(result)
        stuck = not count and upcoming is not None and upcoming <= time.time()
        if failed_keys(result) or stuck:
            self._retry(session_id)  # still pending: tried again after a pause
            return
        self._pause.pop(session_id, None)
        self._arm(session_id)

    def _retry(self, session_id: str) -> None:
        pause = min(RETRY_MOST, self._pause.get(session_id, RETRY_FIRST / 2) * 2)
        self._pause[session_id] = pause
        self._arm(session_id, pause)
