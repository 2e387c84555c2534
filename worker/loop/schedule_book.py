"""A worker's pending schedules: followed from the log, staged by ``turn.schedule()``, and
refused when a request comes for one before its time (docs/apps.md, "Schedules").

The log is the truth (``worker.store.schedules``): the book follows the records appended
since it last looked, so it costs nothing per request that schedules nothing. What an
App schedules while it handles a request is staged here and joins the session's next
group commit, so it exists exactly when the request's records do.
"""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Iterable, Set
from typing import Final

from worker.ipc.wire import Message
from worker.store.errors import SessionError
from worker.store.format.records import Record, Schedule
from worker.store.schedules import follow_from, format_time, parse_time, schedule_records
from worker.store.session import Session

MAX_KEY_CHARS: Final = 256


class ScheduleRefused(SessionError):
    """A schedule, a cancel or a scheduled delivery was refused; nothing was written."""

    def __init__(self, key: str, why: str) -> None:
        super().__init__(key, why)
        self.key = key
        self.why = why

    def __str__(self) -> str:
        shown = self.key if len(self.key) <= 80 else self.key[:77] + "..."
        return f"schedule {shown!r}: {self.why}"


class NotDue(ScheduleRefused):
    """A request came for a pending schedule before its time: refused, not applied."""


def normalize_at(at: object) -> str:
    """``at`` in the records' time format; ValueError naming what is wrong.

    Accepts an aware ``datetime``, or a string: the records' format or ISO 8601 with an
    offset (``2026-12-03T14:00:00+00:00``).
    """
    if isinstance(at, str):
        if parse_time(at) is not None:
            return at
        try:
            at = datetime.datetime.fromisoformat(at)
        except ValueError:
            raise ValueError(f"at {at!r} is not an ISO 8601 time") from None
    if not isinstance(at, datetime.datetime):
        raise TypeError(f"at must be a datetime or a string, got {type(at).__name__}")
    if at.tzinfo is None:
        raise ValueError(f"at {at.isoformat()} has no time zone: give one (UTC: +00:00)")
    try:
        written = format_time(at.timestamp())
    except (OverflowError, ValueError, OSError):
        written = ""
    if parse_time(written) is None:  # a year past 9999 in UTC (or before 1): no record time
        raise ValueError(f"at {at.isoformat()} is not a time from 0001 to 9999 in UTC")
    return written


def check_key(key: object) -> str:
    if type(key) is not str or not key or len(key) > MAX_KEY_CHARS:
        raise ValueError(f"a schedule's key is 1-{MAX_KEY_CHARS} characters, got {key!r}")
    return key


class ScheduleBook:
    """The pending schedules of one session, by key, as its log says."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._epoch = -1
        self._seen = 0
        self._pending: dict[str, Schedule] = {}
        self._applied: set[str] = set()
        self.staged: list[Schedule] = []

    def pending(self) -> dict[str, Schedule]:
        """The pending schedules now (the records appended since the last look followed)."""
        records = self.session.records
        if self.session.epoch != self._epoch or len(records) < self._seen:
            self._epoch, self._seen = self.session.epoch, 0
            self._pending, self._applied = {}, set()
        if len(records) > self._seen:
            follow_from(self._pending, self._applied, records, self._seen)
            self._seen = len(records)
        return self._pending

    def delivered_at(self, key: str) -> str | None:
        """The time of ``key``'s schedule if it was delivered in this epoch: a request of
        the key was applied, it is not pending, and the last schedule record of the key in
        the epoch is its ``Schedule`` (not an ``Unschedule``). Only a retry asks: the
        epoch's schedule records are read then, never on a request's path."""
        if key in self.pending() or key not in self._applied:
            return None
        last = None
        for record in schedule_records(self.session.records):
            if record.key == key:
                last = record
        return last.at if isinstance(last, Schedule) else None

    def summary(self) -> list[object]:
        """``[count, next due]`` (the records' time format, None when nothing is pending)."""
        pending = self.pending()
        due = min((s.at for s in pending.values()), default=None)
        return [len(pending), due]

    def due(self, now: float) -> list[Schedule]:
        """The pending schedules whose time has come, oldest first."""
        ready = [s for s in self.pending().values() if (parse_time(s.at) or 0.0) <= now]
        return sorted(ready, key=lambda s: s.at)

    def refusal(self, key: object) -> NotDue | None:
        """The refusal of a request with ``key`` if it names a pending schedule not yet due."""
        if type(key) is not str:
            return None
        schedule = self.pending().get(key)
        if schedule is None or (parse_time(schedule.at) or 0.0) <= time.time():
            return None
        return NotDue(key, f"is due at {schedule.at}, not before: nothing was applied")

    # -- what an App schedules (worker.app.turn.schedule) --------------------------------

    def stage(
        self, at: object, text: object, key: object, untrusted: object, batch: Set[object]
    ) -> str:
        """Stage a Schedule for the session's next group commit; its key. ``batch``: the
        keys of the requests of this chunk, which the schedule may not take."""
        when = normalize_at(at)
        if type(text) is not str:
            raise TypeError(f"schedule() takes a string text, got {type(text).__name__}")
        if type(untrusted) is not bool:
            raise TypeError("schedule(): untrusted must be True or False")
        chosen = check_key(f"schedule-{uuid.uuid4().hex}" if key is None else key)
        if chosen in self.pending() or any(s.key == chosen for s in self.staged):
            raise ValueError(f"schedule(): key {chosen!r} is already scheduled")
        if chosen in batch:
            raise ValueError(f"schedule(): key {chosen!r} is a request's of this batch")
        if self.session.find_key(chosen) is not None:
            raise ValueError(f"schedule(): key {chosen!r} was already used by a request")
        self.staged.append(Schedule(key=chosen, at=when, text=text, untrusted=untrusted))
        return chosen

    def with_staged(self, records: Iterable[Record]) -> list[Record]:
        """``records`` and the staged schedules after them; the stage is emptied."""
        staged, self.staged = self.staged, []
        return [*records, *staged]


_book: ScheduleBook | None = None  # one worker, one session: its book


def book_of(session: Session) -> ScheduleBook:
    """The book of ``session`` (one per worker: the runner's, and ``describe``'s)."""
    global _book  # noqa: PLW0603 - a one-entry cache: a worker serves one session
    if _book is None or _book.session is not session:
        _book = ScheduleBook(session)
    return _book


def delivery(schedule: Schedule) -> Message:
    """The request a due schedule is delivered as: its key, text and untrusted flag."""
    return {
        "text": schedule.text,
        "key": schedule.key,
        "untrusted": schedule.untrusted,
        "scheduled": True,
    }
