"""Hung-worker detection: a worker whose loop has not turned for too long is reported."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class Timers(Protocol):
    """The timers of the daemon's loop."""

    def call_at(self, when: float, callback: Callable[[], None]) -> object: ...
    def cancel(self, timer: object) -> None: ...


class HangWatch:
    """Calls ``on_hang(silent_seconds)`` when the worker showed no sign of life for
    ``timeout`` seconds.

    Signs of life are its messages (``heard``) and its heartbeats, read from the shared
    cell by ``last_beat`` only when the check comes due: the worker's loop stamps the cell
    at every turn, at least every ``timeout``/4 seconds, and neither wakes the daemon.
    One timer per session, re-armed from the newest sign when it fires: silence means the
    loop is stopped (SIGSTOP) or stuck.
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
        self._timer: object | None = None

    def heard(self) -> None:
        self.last_heard = time.monotonic()

    def arm(self) -> None:
        """Start (or restart) watching, from the newest sign of life."""
        self.cancel()
        if self.timeout is not None:
            self._timer = self.timers.call_at(self._newest() + self.timeout, self._check)

    def _newest(self) -> float:
        return max(self.last_heard, self.last_beat())

    def cancel(self) -> None:
        if self._timer is not None:
            self.timers.cancel(self._timer)
            self._timer = None

    def _check(self) -> None:
        self._timer = None
        assert self.timeout is not None
        silent = time.monotonic() - self._newest()
        if silent < self.timeout:
            self.arm()
        else:
            self.on_hang(silent)
