"""The per-session state machine and the restart policy."""

from __future__ import annotations

import enum
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from supervisor.errors import IllegalTransition


class State(enum.Enum):
    """Where a session's worker is in its life."""

    STOPPED = "STOPPED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    BACKOFF = "BACKOFF"
    STOPPING = "STOPPING"
    EXITED = "EXITED"
    FATAL = "FATAL"
    IDLE = "IDLE"


S = State
TRANSITIONS: Final[dict[State, frozenset[State]]] = {
    S.STOPPED: frozenset({S.STARTING}),
    # Hibernated: no process, no descriptor; the next request or attach starts it.
    S.IDLE: frozenset({S.STARTING, S.STOPPED}),
    S.STARTING: frozenset({S.RUNNING, S.BACKOFF, S.FATAL, S.STOPPING, S.EXITED}),
    S.RUNNING: frozenset({S.STOPPING, S.BACKOFF, S.FATAL, S.EXITED}),
    S.BACKOFF: frozenset({S.STARTING, S.STOPPED, S.FATAL}),
    S.STOPPING: frozenset({S.STOPPED, S.IDLE}),
    S.EXITED: frozenset({S.STARTING, S.STOPPED}),
    S.FATAL: frozenset({S.STARTING, S.STOPPED}),
}
"""The one table of allowed moves; anything else raises IllegalTransition."""


class StateMachine:
    """A session's current state; ``move`` checks every change against TRANSITIONS and
    tells the observer (events, metrics) of each one."""

    def __init__(
        self,
        session: str,
        state: State = State.STOPPED,
        observer: Callable[[State, State], None] | None = None,
    ) -> None:
        self.session = session
        self.state = state
        self.observer = observer

    def move(self, wanted: State) -> None:
        if wanted not in TRANSITIONS[self.state]:
            raise IllegalTransition(self.session, self.state.value, wanted.value)
        old, self.state = self.state, wanted
        if self.observer is not None:
            self.observer(old, wanted)


@dataclass(slots=True)
class RestartPolicy:
    """Exponential backoff with jitter, reset after stable uptime, and an intensity limit.

    The first restart after a stable run is immediate (a crash-free session restarts as
    fast as a process can start); each further one waits ``base * 2**(n-1)`` seconds, up
    to ``cap``, with up to ``jitter`` of it added at random. More than ``max_restarts``
    restarts within ``window`` seconds is FATAL (OTP's intensity/period), and so is more
    than ``start_retries`` starts in a row that never reached ready, however slow each
    start is (supervisord's ``startretries``). A worker that exits because its database
    is unreachable is neither, nor a start serve could not spawn for want of descriptors
    or processes: it is started again after ``outage_delay`` for as long as the outage
    or the shortage lasts (docs/scaling.md).
    """

    max_restarts: int = 5
    window: float = 10.0
    base: float = 0.1
    cap: float = 5.0
    jitter: float = 0.25
    stable_after: float = 5.0
    start_retries: int = 5
    start_timeout: float = 60.0
    """Seconds a start may take before the worker says ready; then it is killed (a failed
    start: an App factory that never returns holds nobody's request for ever)."""
    outage_cap: float = 1.0
    """Longest wait before starting again a worker that could not reach its database."""
    _recent: deque[float] = field(default_factory=deque)
    _streak: int = 0
    _failed_starts: int = 0
    _outage_streak: int = 0

    @property
    def failed_starts(self) -> int:
        """Starts in a row that ended before the worker said it was ready."""
        return self._failed_starts

    def on_ready(self) -> None:
        """The worker reached ready: a start that works ends the run of failed starts."""
        self._failed_starts = 0
        self._outage_streak = 0

    def start_failed(self) -> bool:
        """Record a start that never reached ready; True once that is one too many."""
        self._failed_starts += 1
        return self._failed_starts > self.start_retries

    def on_stable(self) -> None:
        """The worker stayed up ``stable_after`` seconds: forget the backoff streak."""
        self._streak = 0

    def next_delay(self, now: float, rng: random.Random) -> float | None:
        """Record a crash at ``now``; return the delay before restarting, or None for FATAL."""
        self._recent.append(now)
        while self._recent and self._recent[0] < now - self.window:
            self._recent.popleft()
        if len(self._recent) > self.max_restarts:
            return None
        streak = self._streak
        self._streak += 1
        if streak == 0:
            return 0.0
        delay: float = min(self.cap, self.base * 2.0 ** (streak - 1))
        return delay + delay * self.jitter * rng.random()

    def outage_delay(self, rng: random.Random) -> float:
        """The delay before starting again a worker that lost its database (a store's
        outage, not the session's fault: never FATAL, and not counted with the crashes):
        from ``base``, doubling, to ``outage_cap``, with jitter."""
        delay: float = min(self.outage_cap, self.base * 2.0**self._outage_streak)
        self._outage_streak += 1
        return delay + delay * self.jitter * rng.random()

    def reset(self) -> None:
        """Forget all history (an operator's explicit start)."""
        self._recent.clear()
        self._streak = 0
        self._failed_starts = 0
        self._outage_streak = 0
