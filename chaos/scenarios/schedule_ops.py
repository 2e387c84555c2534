"""The operations of the ``schedules`` scenario: schedule, cancel and deliver requests.

``schedule``: the keyed request ``op.key`` (the default app's four records) and, in the
same group commit, ``Schedule{op.name, op.at}``, as an App's ``turn.schedule()`` writes
it. ``unschedule``: ``Unschedule{op.name}`` if it is pending (keyless, idempotent).
``deliver``: every pending schedule whose time has come, each applied as the request the
worker makes of it (``worker.loop.schedule_book``: the same selection and the same request
the daemon's ``deliver_due`` gets), one group each; keyless, idempotent (a key applied
before is not applied again). Times are fixed, far in the past or far in the future, so
that a case's outcome is the same whenever it runs.
"""

from __future__ import annotations

import time
from typing import Final

from chaos.scenarios.scenario_types import Op, Scenario
from worker.loop.schedule_book import book_of, delivery
from worker.store.format.records import (
    Assistant,
    Record,
    Schedule,
    ToolResult,
    Unschedule,
    Usage,
    User,
)
from worker.store.session import Session

SCHEDULE_KINDS: Final = ("schedule", "unschedule", "deliver")
PAST: Final = "2000-01-01T00:00:00.000000Z"
FUTURE: Final = "2999-01-01T00:00:00.000000Z"
SCHEDULED_SHAPE: Final = ("User", "ToolResult", "Assistant", "Usage", "Schedule")


def _request(session: Session, text: str, key: str, untrusted: bool = False) -> list[Record]:
    user = User(text=text, key=key, untrusted=untrusted)
    return [
        user,
        ToolResult(call=session.next_call(), tool="echo", output=text, ok=True),
        Assistant(text=f"echo: {text}"),
        Usage(prompt_tokens=5, completion_tokens=7, context_tokens=12),
    ]


def apply_schedule_op(session: Session, op: Op) -> Session:
    """Run one of ``SCHEDULE_KINDS`` idempotently; the session."""
    book = book_of(session)
    if op.kind == "schedule":
        if session.find_key(op.key) is not None:
            return session  # applied before the crash: the log answers the retry
        records = _request(session, f"text of {op.key}", op.key)
        schedule = Schedule(key=op.name, at=op.at, text=f"scheduled {op.name}")
        session.append_many([*records, schedule])
    elif op.kind == "unschedule":
        if op.name in book.pending():
            session.append(Unschedule(key=op.name))
    elif op.kind == "deliver":
        for due in book.due(time.time()):
            request = delivery(due)
            if session.find_key(due.key) is None:
                text, key = str(request["text"]), str(request["key"])
                session.append_many(_request(session, text, key, due.untrusted))
    else:
        raise ValueError(f"unknown op {op.kind!r}")
    return session


SCHEDULES: Final = Scenario(
    name="schedules",
    doc="requests that schedule requests (one due long ago, one far ahead, one cancelled), "
    "two epoch commits that carry the pending ones, then the due ones delivered",
    ops=(
        Op("create"),
        Op("schedule", key="g1", name="due-a", at=PAST),
        Op("schedule", key="g2", name="ahead-b", at=FUTURE),
        Op("schedule", key="g3", name="due-c", at=PAST),
        Op("unschedule", name="due-c"),
        Op("commit", epoch=1, summary="schedules pending"),
        Op("group", key="g4"),
        Op("commit", epoch=2, summary="still pending"),
        Op("deliver"),
        Op("group", key="g5"),
    ),
    shapes=tuple((key, SCHEDULED_SHAPE) for key in ("g1", "g2", "g3")),
)
