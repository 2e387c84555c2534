"""Tool call numbers as handed out: each worker's ``next_call`` is watched.

``call-numbers-unique`` reads the numbers written; numbers handed out and not written
yet (a tool call in progress, reserved before an epoch commit and written after it)
are only seen here. In one process no number is handed out twice, and none is at or
below a call already on disk when the process started (a number handed out and never
written may be handed out again after a restart: no process kept it, docs/format.md).
"""

from __future__ import annotations

import json

from chaos.faults.hook import EventPipe
from chaos.oracle.oracle import ClientLog, log_files
from worker.store.session import Session

INVARIANT = "call-numbers-handed-out-once"


def watch_next_call(events: EventPipe) -> None:
    """In a case's child: report every number ``Session.next_call`` hands out."""
    original = Session.next_call

    def next_call(self: Session) -> int:
        number = original(self)
        events.send({"e": "call", "n": number})
        return number

    Session.next_call = next_call  # type: ignore[method-assign]


def highest_call_on_disk(home: str) -> int:
    """The highest ToolResult call number in the session's logs (0: none)."""
    highest = 0
    for path in log_files(home):
        with open(path, "rb") as f:
            for line in f.read().split(b"\n"):
                if b'"ToolResult"' not in line:
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                call = record.get("call") if isinstance(record, dict) else None
                if type(call) is int:
                    highest = max(highest, call)
    return highest


def judge_calls(log: ClientLog, floor: int, handed: list[int], who: str) -> None:
    """Record a problem if ``handed`` (one process's numbers, in order) repeats a number
    or reuses one at or below ``floor`` (the highest call on disk when it started)."""
    log.checks.add(INVARIANT)
    seen: set[int] = set()
    for number in handed:
        if number in seen:
            log.problem(INVARIANT, f"{who} handed out call {number} twice")
            return
        if number <= floor:
            log.problem(
                INVARIANT, f"{who} handed out call {number}; call {floor} was already on disk"
            )
            return
        seen.add(number)
