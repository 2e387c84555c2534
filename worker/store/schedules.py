"""Which ``Schedule`` records of a session are pending, and the time format they use.

A schedule is pending from its ``Schedule`` record until a request with its key is
applied (a ``User`` with that key) or an ``Unschedule`` with its key is written. An
epoch commit writes every schedule pending at the closing ``EpochEnd`` into the next
epoch's log, right after its ``SessionStart`` (``carried_schedules``), so the newest
epoch alone says what is pending: open reads no older epoch for it (docs/format.md,
"Schedules").
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from typing import Final

from worker.store.format.records import Record, Schedule, Unschedule, User
from worker.store.format.records_view import typed

_FOLLOWED: Final = (User, Schedule, Unschedule)
_RECORD_TIME: Final = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)\.(\d{6})Z")


def parse_time(text: str) -> float | None:
    """Seconds since the epoch of a time in the records' format; None if it is not one."""
    match = _RECORD_TIME.fullmatch(text)
    if match is None:
        return None
    import calendar  # noqa: PLC0415 - it loads datetime and locale, 4 ms (issue 32)

    year, month, day, hour, minute, second, micros = (int(g) for g in match.groups())
    try:
        whole = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
        time.gmtime(whole)  # refuses what timegm let through (month 13 -> next year)
    except (OverflowError, ValueError):
        return None
    if (month, day) != time.gmtime(whole)[1:3] or hour > 23 or minute > 59 or second > 59:
        return None
    return whole + micros / 1_000_000


def format_time(seconds: float) -> str:
    """The records' time format of ``seconds`` since the epoch (UTC, microseconds)."""
    whole, micros = divmod(round(seconds * 1_000_000), 1_000_000)
    t = time.gmtime(whole)
    return (
        f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T"
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.{micros:06d}Z"
    )


def follow(pending: dict[str, Schedule], applied: set[str], records: Iterable[Record]) -> None:
    """Update ``pending`` (and the keys ``applied`` in this epoch) with later ``records``.

    A ``Schedule`` whose key was already applied in the epoch is not pending (the
    worker refuses such a schedule; a log written otherwise still reads one way).
    """
    for record in records:
        if isinstance(record, User):
            if record.key is not None:
                applied.add(record.key)
                pending.pop(record.key, None)
        elif isinstance(record, Schedule):
            if record.key not in applied and record.key not in pending:
                pending[record.key] = record
        elif isinstance(record, Unschedule):
            pending.pop(record.key, None)


def follow_from(
    pending: dict[str, Schedule], applied: set[str], records: Sequence[Record], start: int = 0
) -> None:
    """``follow`` the records from index ``start``, decoding only those it needs.

    An epoch's records (``EpochRecords``) without a schedule among them give their
    Users' keys without decoding a line: only those can change what is pending.
    """
    epoch = typed(records)
    if epoch is None:
        follow(pending, applied, records[start:])
    elif epoch.holds(Schedule, Unschedule, start=start):
        follow(pending, applied, [r for _n, r in epoch.of_type(*_FOLLOWED, start=start)])
    else:
        keys = epoch.request_keys(start)
        applied.update(keys)
        if pending:
            for key in keys:
                pending.pop(key, None)


def schedule_records(records: Sequence[Record]) -> list[Schedule | Unschedule]:
    """The ``Schedule`` and ``Unschedule`` records of an epoch, in order (an epoch's
    records decode only those lines)."""
    epoch = typed(records)
    found = records if epoch is None else [r for _n, r in epoch.of_type(Schedule, Unschedule)]
    return [r for r in found if isinstance(r, Schedule | Unschedule)]


def pending_schedules(records: Sequence[Record]) -> dict[str, Schedule]:
    """The schedules pending after an epoch's ``records`` (its log, in order), by key."""
    pending: dict[str, Schedule] = {}
    follow_from(pending, set(), records)
    return pending


def carried_schedules(records: Sequence[Record]) -> list[Schedule]:
    """The ``Schedule`` records the epoch after ``records`` starts with: its pending ones,
    in the order they were written, unchanged (a resume computes the same list)."""
    return list(pending_schedules(records).values())
