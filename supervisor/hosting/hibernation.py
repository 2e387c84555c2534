"""Which live sessions to hibernate: idle past ``--idle-stop``, or least recently used past
``--max-live``; and when a woken session may start.

Sessions are kept in one ordered map, least recently used first, so a use is O(1) and
finding who is idle or who must make room reads only the front of it: with ten thousand
sessions the daemon needs one timer, for the oldest, not one per session.

A session is never idle while a request is in progress in its worker, relayed or on a
direct connection (the worker says so in its heartbeat cell). Under ``--max-live`` a
woken session starts only when fewer workers than the cap are alive; until then it
waits, still IDLE with its requests queued, while the least recently used sessions
that are not serving make room (a worker just woken is first given the chance to
serve what woke it).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Final

from supervisor.hosting.session_actions import Hosted, is_busy
from supervisor.states import State

RESIDENCY: Final = 1.0
"""Seconds a worker woken by a request may keep its place under ``--max-live`` before it
has served one: a woken session serves what woke it before it makes room again. (A
worker started explicitly, by create or start, has nothing waiting and gets no such
grace: it makes room for the next start at once, least recently used first.)"""
_LIVE: Final = frozenset({State.STARTING, State.RUNNING, State.STOPPING})


class UsageClock:
    """When each live session was last used, in order of use."""

    def __init__(self, *, idle_stop: float | None, max_live: int | None) -> None:
        self.idle_stop = idle_stop
        self.max_live = max_live
        self._last: OrderedDict[str, float] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.idle_stop is not None or self.max_live is not None

    def __len__(self) -> int:
        return len(self._last)

    def __contains__(self, session: object) -> bool:
        return session in self._last

    def used(self, session: str, now: float) -> None:
        """The session served something (or its worker started): it is the newest."""
        self._last[session] = now
        self._last.move_to_end(session)

    def forget(self, session: str) -> None:
        """The session's worker is gone (stopped, crashed, hibernated)."""
        self._last.pop(session, None)

    def last_used(self, session: str) -> float | None:
        return self._last.get(session)

    def idle(self, now: float) -> list[str]:
        """Sessions unused for ``idle_stop`` seconds, oldest first."""
        if self.idle_stop is None:
            return []
        found = []
        for session, last in self._last.items():
            if now - last < self.idle_stop:
                break  # the rest were used later still
            found.append(session)
        return found

    def next_idle_check(self) -> float | None:
        """When the least recently used session becomes idle (None: nothing to watch)."""
        if self.idle_stop is None or not self._last:
            return None
        return next(iter(self._last.values())) + self.idle_stop

    def over_cap(
        self, busy: Callable[[str], bool], room_for: int = 0, live: int | None = None
    ) -> list[str]:
        """Least recently used sessions to stop so that at most ``max_live - room_for`` of
        ``live`` workers (default: the sessions here) stay; sessions for which ``busy`` is
        true (a request waiting on them) are passed over."""
        if self.max_live is None:
            return []
        excess = (len(self._last) if live is None else live) + room_for - self.max_live
        found: list[str] = []
        for session in self._last:
            if len(found) >= excess:
                break
            if not busy(session):
                found.append(session)
        return found


class Hibernation:
    """The daemon's hibernation: the idle timer, the cap on live workers, the wake queue."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sessions: Mapping[str, Hosted],
        hibernate: Callable[[str, str], None],
        *,
        idle_stop: float | None,
        max_live: int | None,
    ) -> None:
        self.loop = loop
        self.sessions = sessions
        self.clock = UsageClock(idle_stop=idle_stop, max_live=max_live)
        self._hibernate = hibernate  # (session, why): stop it the ordinary way, to rest IDLE
        self._live = 0  # sessions with a worker: STARTING, RUNNING or STOPPING
        self._leaving = 0  # of those, the ones STOPPING
        self._waking: OrderedDict[str, None] = OrderedDict()  # IDLE, waiting for room
        self._woken: set[str] = set()  # started from the line: fresh once RUNNING
        self._fresh: dict[str, float] = {}  # woken, RUNNING since this time, nothing served
        self._idle_timer: asyncio.TimerHandle | None = None
        self._room_timer: asyncio.TimerHandle | None = None
        self._soon: asyncio.Handle | None = None
        self._closed = False

    @property
    def live(self) -> int:
        return self._live

    def on_move(self, hosted: Hosted, old: State, new: State) -> None:
        self._live += (new in _LIVE) - (old in _LIVE)
        self._leaving += (new is State.STOPPING) - (old is State.STOPPING)
        if new is State.RUNNING:
            if hosted.id in self._woken:
                self._fresh[hosted.id] = time.monotonic()
            self.used(hosted.id)
        elif old is State.RUNNING:
            self._fresh.pop(hosted.id, None)
            self.clock.forget(hosted.id)
            self._arm_idle_timer()
        if new is not State.STARTING:
            self._woken.discard(hosted.id)
        if self.clock.max_live is not None:
            self._balance_soon()

    def used(self, session: str) -> None:
        """The session served something (or its worker started): it is the newest."""
        first = session not in self.clock
        self.clock.used(session, time.monotonic())
        if first:
            self._arm_idle_timer()

    def served(self, session: str) -> None:
        """The worker reported requests served: used, and no longer fresh."""
        self._fresh.pop(session, None)
        self.used(session)
        if self._waking:
            self._balance_soon()

    def wake(self, hosted: Hosted) -> None:
        """A request wants an IDLE session: start it now, or once there is room for it."""
        if self.clock.max_live is None:
            hosted.start()
            return
        if self._closed:
            return  # the daemon is stopping: nothing starts any more
        self._waking[hosted.id] = None
        self._balance()

    def stopping(self) -> None:
        self._closed = True
        self._waking.clear()

    def close(self) -> None:
        for timer in (self._idle_timer, self._room_timer, self._soon):
            if timer is not None:
                timer.cancel()

    # -- idle ------------------------------------------------------------------------

    def _busy(self, session: str) -> bool:
        hosted = self.sessions.get(session)
        return hosted is None or is_busy(hosted) or hosted.state is not State.RUNNING

    def _last_batch_ended(self, session: str) -> float | None:
        hosted = self.sessions.get(session)
        worker = hosted.worker if hosted is not None else None
        return worker.last_batch_ended() if worker is not None else None

    def _arm_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        when = self.clock.next_idle_check()
        if when is not None:
            self._idle_timer = self.loop.call_at(when, self._idle_check)

    def _idle_check(self) -> None:
        self._idle_timer = None
        now = time.monotonic()
        for session in self.clock.idle(now):
            ended = self._last_batch_ended(session)
            if self._busy(session):
                self.used(session)  # look again a full period later
            elif ended is not None and now - ended < (self.clock.idle_stop or 0.0):
                # Busy at the last check, its batch ended since, before the worker's
                # report of it came in: not idle yet. Looked at again a full period from
                # now (the clock's order is by time of use: never before that end's due).
                self.used(session)
            else:
                self.clock.forget(session)
                self._hibernate(session, f"no request for {self.clock.idle_stop:g} s")
        self._arm_idle_timer()

    # -- the cap -----------------------------------------------------------------------

    def _balance_soon(self) -> None:
        """Once per loop turn, however many moves and reports came in it."""
        if self._soon is None and not self._closed:
            self._soon = self.loop.call_soon(self._balance)

    def _balance(self) -> None:
        self._soon = None
        self._admit()
        self._make_room()

    def _admit(self) -> None:
        """Start the sessions waiting for room, first come first served, while there is."""
        cap = self.clock.max_live
        while self._waking and cap is not None and self._live < cap and not self._closed:
            session, _ = self._waking.popitem(last=False)
            hosted = self.sessions.get(session)
            if hosted is not None and hosted.state is State.IDLE:
                self._woken.add(session)
                hosted.start()  # counted live by the move to STARTING

    def _make_room(self) -> None:
        """Hibernate the least recently used sessions that serve nothing, as many as the
        workers past the cap (those waiting included, those stopping excepted)."""
        if self._room_timer is not None:
            self._room_timer.cancel()
            self._room_timer = None
        now = time.monotonic()
        soonest: list[float] = []

        def kept(session: str) -> bool:
            if self._busy(session):
                return True
            since = self._fresh.get(session)
            if since is not None and now - since < RESIDENCY:
                soonest.append(since + RESIDENCY)
                return True
            return False

        room_for = len(self._waking) - self._leaving
        victims = self.clock.over_cap(kept, room_for=room_for, live=self._live)
        for session in victims:
            self.clock.forget(session)
            self._hibernate(session, f"least recently used past --max-live {self.clock.max_live}")
        assert self.clock.max_live is not None
        short = self._live - self._leaving + len(self._waking) - self.clock.max_live
        if short > 0 and soonest and not self._closed:
            # Not enough room yet: look again when the first fresh worker's time is up
            # (a report of requests served, or a worker's exit, looks again sooner).
            self._room_timer = self.loop.call_at(min(soonest), self._balance)
