"""Hung-worker detection: a worker whose loop has been silent too long is reported."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class Timers(Protocol):
    """The timers of the daemon's loop."""

    def call_at(self, when: float, callback: Callable[[], None]) -> object: ...
    def cancel(self, timer: object) -> None: ...


class HangWatch:
    """Calls ``on_hang(silent_seconds)`` when nothing was heard for ``timeout`` seconds.

    One timer per session, re-armed from the last message heard when it fires, so a busy
    session costs no timer churn per message. The worker's loop sends a heartbeat every
    ``timeout``/4 seconds; silence means the loop is stopped (SIGSTOP) or stuck.
    """

    def __init__(
        self, timers: Timers, timeout: float | None, on_hang: Callable[[float], None]
    ) -> None:
        self.timers = timers
        self.timeout = timeout
        self.on_hang = on_hang
        self.last_heard = time.monotonic()
        self._timer: object | None = None

    def heard(self) -> None:
        self.last_heard = time.monotonic()

    def arm(self) -> None:
        """Start (or restart) watching, from the last message heard."""
        self.cancel()
        if self.timeout is not None:
            self._timer = self.timers.call_at(self.last_heard + self.timeout, self._check)

    def cancel(self) -> None:
        if self._timer is not None:
            self.timers.cancel(self._timer)
            self._timer = None

    def _check(self) -> None:
        self._timer = None
        assert self.timeout is not None
        silent = time.monotonic() - self.last_heard
        if silent < self.timeout:
            self.arm()
        else:
            self.on_hang(silent)
