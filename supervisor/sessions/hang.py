"""Hung-worker detection: a worker whose loop has not turned for too long is reported.

Silence counts only over time the daemon itself ran and watched. A whole service frozen
and thawed (a cgroup freezer, ``docker pause``, a paused VM, SIGSTOP of everything)
stops the daemon's loop with its workers: when it runs again, every worker's last beat
is as old as the freeze, and the workers have not been scheduled yet to stamp a new
one. The daemon notices that its own loop did not run by its timers firing late
(``LoopGaps``), and a gap restarts every watch window from its end.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Final, Protocol

LATE_SLACK: Final = 0.25
"""Seconds a timer may fire late, on a busy machine, with the loop still counted as
running; a later one says the loop did not run (frozen, or stalled) until it fired."""
TICKS_PER_TIMEOUT: Final = 4
"""The gap tick fires this many times per hang timeout (the shortest watched)."""


class Timers(Protocol):
    """The timers of the daemon's loop."""

    def call_at(self, when: float, callback: Callable[[], None]) -> object: ...
    def cancel(self, timer: object) -> None: ...


class LoopGaps:
    """When the daemon's loop last ran again after it did not run (``resumed_at``).

    Every hang check says when it was due and when it ran (``note``); a tick of its own,
    ``TICKS_PER_TIMEOUT`` times per the shortest hang timeout armed and only while one
    is, bounds how long a freeze can go unseen: one that ends before any check was due
    is caught by the tick. One per loop (``of``), shared by every session's watch.
    """

    _OF: Final[weakref.WeakKeyDictionary[Timers, LoopGaps]] = weakref.WeakKeyDictionary()

    def __init__(self, timers: Timers) -> None:
        self.timers = timers
        self.resumed_at = 0.0
        self._armed: weakref.WeakSet[HangWatch] = weakref.WeakSet()
        self._tick: object | None = None
        self._tick_due = 0.0

    @classmethod
    def of(cls, timers: Timers) -> LoopGaps:
        """The record of ``timers``'s loop (made at the first call)."""
        gaps = cls._OF.get(timers)
        if gaps is None:
            gaps = cls._OF[timers] = cls(timers)
        return gaps

    def note(self, due: float, now: float) -> None:
        """A timer due at ``due`` ran at ``now``: later than the slack, the loop did not
        run in between, and nothing it could have seen then is held against a worker."""
        if now - due > LATE_SLACK:
            self.resumed_at = now

    def armed(self, watch: HangWatch) -> None:
        """``watch`` waits for its check: tick while any does, often enough for it."""
        self._armed.add(watch)
        if watch.timeout is None:
            return
        # Only this watch's own timeout: arming is per check, and the tick is one per
        # loop (the shortest of all is taken again at each tick).
        due = time.monotonic() + watch.timeout / TICKS_PER_TIMEOUT
        if self._tick is None or self._tick_due > due:
            self._schedule(due)

    def disarmed(self, watch: HangWatch) -> None:
        self._armed.discard(watch)
        if not self._armed and self._tick is not None:
            self.timers.cancel(self._tick)
            self._tick = None

    def _cadence(self) -> float | None:
        timeouts = [w.timeout for w in self._armed if w.timeout is not None]
        return min(timeouts) / TICKS_PER_TIMEOUT if timeouts else None

    def _schedule(self, due: float) -> None:
        if self._tick is not None:
            self.timers.cancel(self._tick)
        self._tick_due = due
        self._tick = self.timers.call_at(due, self._ticked)

    def _ticked(self) -> None:
        self._tick = None
        now = time.monotonic()
        self.note(self._tick_due, now)
        cadence = self._cadence()
        if cadence is not None:
            self._schedule(now + cadence)


class HangWatch:
    """Calls ``on_hang(silent_seconds)`` when the worker showed no sign of life for
    ``timeout`` seconds of the daemon's watching.

    Signs of life are its messages (``heard``) and its heartbeats, read from the shared
    cell by ``last_beat`` only when the check comes due: the worker's loop stamps the cell
    at every turn, at least every ``timeout``/4 seconds, and neither wakes the daemon.
    One timer per session, re-armed from the newest sign when it fires: silence means the
    loop is stopped (SIGSTOP) or stuck. The window starts again when the daemon's own loop
    resumes after a gap (``LoopGaps``): a worker is judged on what it did while watched.
    """

    def __init__(
        self,
        timers: Timers,
        timeout: float | None,
        on_hang: Callable[[float], None],
        last_beat: Callable[[], float],
    ) -> None:
        self.timers = timers
        self.timeout = timeout
        self.on_hang = on_hang
        self.last_beat = last_beat
        self.last_heard = time.monotonic()
        self.gaps = LoopGaps.of(timers)
        self.verdict: float | None = None
        """The newest sign of life a hang verdict was given on (None: no verdict)."""
        self._timer: object | None = None
        self._due = 0.0

    def heard(self) -> None:
        self.last_heard = time.monotonic()

    def arm(self) -> None:
        """Start (or restart) watching, from the newest sign of life."""
        self.cancel()
        self.verdict = None
        if self.timeout is not None:
            self._due = self._newest() + self.timeout
            self._timer = self.timers.call_at(self._due, self._check)
            self.gaps.armed(self)

    def _newest(self) -> float:
        return max(self.last_heard, self.last_beat(), self.gaps.resumed_at)

    def cancel(self) -> None:
        if self._timer is not None:
            self.timers.cancel(self._timer)
            self._timer = None
        self.gaps.disarmed(self)

    def progressed_since_verdict(self) -> bool:
        """The worker stamped its heartbeat after the hang verdict was given: it ran, and
        its request made progress, when it was killed (the verdict raced a thaw)."""
        return self.verdict is not None and self.last_beat() > self.verdict

    def _check(self) -> None:
        self._timer = None
        assert self.timeout is not None
        now = time.monotonic()
        self.gaps.note(self._due, now)  # a late check: the loop itself did not run
        newest = self._newest()
        silent = now - newest
        if silent < self.timeout:
            self.arm()
        else:
            self.gaps.disarmed(self)
            self.verdict = newest
            self.on_hang(silent)
