"""Live workers' resident memory for the metrics, read a few workers a loop turn.

Reading one worker's RSS is two ``/proc`` reads (its identity, then its memory), some
0.1 ms; a scrape that read every live worker's would hold the loop for as long as there
are workers, once per scraper. A scrape here answers from the figures already read and,
if some are older than ``MAX_AGE``, starts a refresh that reads ``PER_TURN`` workers a
loop turn, so control requests and other connections are served in between.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Final, Protocol

MAX_AGE: Final = 5.0
"""Seconds after which a worker's figure is read again (at the next scrape)."""
PER_TURN: Final = 8
"""Workers read per loop turn while refreshing."""


class MeasuredWorker(Protocol):
    """A live worker whose RSS can be read."""

    @property
    def pid(self) -> int: ...
    def rss_bytes(self) -> int | None: ...


class RssCache:
    """The last RSS read of each live worker, refreshed off the scrape's path."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        workers: Callable[[], Iterable[MeasuredWorker]],
        *,
        max_age: float = MAX_AGE,
        per_turn: int = PER_TURN,
    ) -> None:
        self.loop = loop
        self.workers = workers
        self.max_age = max_age
        self.per_turn = per_turn
        self.reads = 0
        self._figures: dict[int, tuple[int, float]] = {}  # pid -> (rss, when read)
        self._refreshing = False

    def store(self, pid: int, rss: int) -> None:
        """A figure read elsewhere (the --max-rss check) serves the metrics too."""
        self._figures[pid] = (rss, time.monotonic())

    def forget(self, pid: int) -> None:
        self._figures.pop(pid, None)

    def figures(self) -> list[int]:
        """The RSS of each live worker read so far; a refresh starts if some are old."""
        live = {worker.pid for worker in self.workers()}
        for pid in [p for p in self._figures if p not in live]:
            del self._figures[pid]
        if not self._refreshing and self._stale(live, time.monotonic()):
            self._refreshing = True
            self.loop.call_soon(self._refresh_some)
        return [rss for rss, _when in self._figures.values() if rss >= 0]

    def _stale(self, live: Iterable[int], now: float) -> bool:
        for pid in live:
            figure = self._figures.get(pid)
            if figure is None or now - figure[1] >= self.max_age:
                return True
        return False

    def _refresh_some(self) -> None:
        now = time.monotonic()
        stale = []
        for worker in self.workers():
            figure = self._figures.get(worker.pid)
            if figure is None or now - figure[1] >= self.max_age:
                stale.append((figure[1] if figure is not None else 0.0, worker))
        stale.sort(key=lambda pair: pair[0])
        for _when, worker in stale[: self.per_turn]:
            self.reads += 1
            rss = worker.rss_bytes()
            # A worker that just died reads as None: kept as unknown (-1) until it is
            # reaped, so it is not read again at every turn.
            self._figures[worker.pid] = (-1 if rss is None else rss, now)
        if len(stale) > self.per_turn:
            self.loop.call_soon(self._refresh_some)  # the rest at the next turn
        else:
            self._refreshing = False
