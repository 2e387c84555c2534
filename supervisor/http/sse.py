"""Resumable event streams of streaming turns (Server-Sent Events).

A send with ``Accept: text/event-stream`` starts a ``Turn``, registered under its
session and request key: a pool thread runs ``Client.stream`` and appends each partial
to the turn's buffer, then the reply. Every event has an id, counted from 1 within the
turn; the connections that follow the turn read the buffer from where they are, so a
client that reconnects with ``Last-Event-ID`` (the same session and Idempotency-Key)
goes on from the next event: no gap, no duplicate. A worker's death restarts the
partials (they are not durable): a ``restart`` event says so before the new ones.

Memory is bounded: a turn keeps at most ``MAX_TURN_BYTES`` of event data and
``MAX_TURN_EVENTS`` events (past it the
oldest are dropped, and a client that asks for one of them gets a ``gap`` event saying
how many it missed); at most ``MAX_TURNS`` turns are registered (running ones are never
dropped: one more is refused ``busy``); a finished turn is kept ``KEEP_FINISHED``
seconds for reconnects, then a reconnect is answered by a retry by key (the reply from
the log). A connection's own output is the transport's (its writer is drained).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Final

from supervisor.errors import ControlError

MAX_TURN_BYTES: Final = 1 << 20
MAX_TURN_EVENTS: Final = 16_384
MAX_TURNS: Final = 256
KEEP_FINISHED: Final = 60.0
FINAL_KINDS: Final = frozenset({"reply", "error"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One event of a turn: its id, its kind (``partial``, ``restart``, ``gap``,
    ``reply``, ``error``) and its data, a JSON text."""

    id: int
    kind: str
    data: str

    def encode(self) -> bytes:
        return f"id: {self.id}\nevent: {self.kind}\ndata: {self.data}\n\n".encode()


class Turn:
    """The events of one streaming request; appended from a pool thread, read by the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, first_id: int = 1) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._events: deque[Event] = deque()
        self._bytes = 0
        self._next_id = first_id
        self._wake_pending = False
        self.finished_at: float | None = None  # monotonic, once the final event is in
        self.changed = asyncio.Event()

    def append(self, kind: str, document: object) -> None:
        """Add an event (any thread); the oldest are dropped past ``MAX_TURN_BYTES``."""
        data = json.dumps(document, ensure_ascii=False, default=repr)
        with self._lock:
            event = Event(id=self._next_id, kind=kind, data=data)
            self._next_id += 1
            self._events.append(event)
            self._bytes += len(data)
            while len(self._events) > 1 and (
                self._bytes > MAX_TURN_BYTES or len(self._events) > MAX_TURN_EVENTS
            ):
                self._bytes -= len(self._events.popleft().data)
            if kind in FINAL_KINDS:
                self.finished_at = time.monotonic()
            wake, self._wake_pending = not self._wake_pending, True
        if wake:
            try:
                self._loop.call_soon_threadsafe(self._wake)
            except RuntimeError:  # the loop closed (serve exits): nobody follows
                return

    def _wake(self) -> None:
        with self._lock:
            self._wake_pending = False
        self.changed.set()

    def after(self, last_id: int) -> tuple[int, list[Event]]:
        """The events after ``last_id``, and how many of those were dropped before them."""
        with self._lock:
            if not self._events:
                return 0, []
            first = self._events[0].id
            dropped = max(0, first - last_id - 1)
            start = max(0, last_id + 1 - first)
            return dropped, list(itertools.islice(self._events, start, None))

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    async def follow(self, last_id: int) -> tuple[int, list[Event]]:
        """Wait until there are events after ``last_id`` (or the turn ended); ``after``'s."""
        while True:
            self.changed.clear()
            dropped, events = self.after(last_id)
            if events or dropped or self.finished:
                return dropped, events
            await self.changed.wait()


class Turns:
    """The registered turns, by (session, key): running ones, and finished ones a while."""

    def __init__(self) -> None:
        self._turns: OrderedDict[tuple[str, str], Turn] = OrderedDict()

    def get(self, session: str, key: str) -> Turn | None:
        if not self._turns:
            return None  # a keyed send's usual case: nothing to look through or expire
        self._expire()
        return self._turns.get((session, key))

    def add(self, session: str, key: str, turn: Turn) -> None:
        """Register ``turn``; ControlError ``busy`` if ``MAX_TURNS`` are running."""
        self._expire()
        if len(self._turns) >= MAX_TURNS:
            finished = [k for k, t in self._turns.items() if t.finished]
            if not finished:
                raise ControlError("busy", f"{MAX_TURNS} streaming turns at once; retry later")
            del self._turns[finished[0]]
        self._turns[(session, key)] = turn

    def _expire(self) -> None:
        now = time.monotonic()
        stale = [
            k
            for k, t in self._turns.items()
            if t.finished_at is not None and now - t.finished_at > KEEP_FINISHED
        ]
        for k in stale:
            del self._turns[k]
