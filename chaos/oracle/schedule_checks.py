"""The invariant of scheduled requests (the ``schedules`` scenario), read from the files.

``schedule-delivered-once-not-early``: once the scenario is finished, every schedule
whose request was acknowledged is delivered exactly once if its time has come and it
was not cancelled (one ``User`` with its key, in any epoch), and never if its time has
not come or it was cancelled (the cancel precedes every delivery in the scenario). A
delivered schedule's key is asked for by its ``Schedule`` record: after a fault its
``User`` is neither acknowledged nor in flight, and that is no violation
(``scheduled_keys``).
"""

from __future__ import annotations

import time
from typing import Final

from chaos.cases import CaseResult
from chaos.scenarios.scenario_types import Scenario
from worker.store.schedules import parse_time

DELIVERED: Final = "schedule-delivered-once-not-early"


def drives_schedules(scenario: Scenario) -> bool:
    return any(op.kind == "schedule" for op in scenario.ops)


def scheduled_keys(epochs: dict[int, list[dict[str, object]]]) -> set[str]:
    """The keys of every ``Schedule`` record in the logs (raw records, by epoch)."""
    return {
        str(r.get("key"))
        for records in epochs.values()
        for r in records
        if r.get("type") == "Schedule"
    }


def final(
    result: CaseResult,
    scenario: Scenario,
    acked: set[str],
    epochs: dict[int, list[dict[str, object]]],
) -> None:
    """Each acknowledged schedule delivered once when due, never early, never cancelled."""
    result.checked.append(DELIVERED)
    users = [
        str(r.get("key")) for n in sorted(epochs) for r in epochs[n] if r.get("type") == "User"
    ]
    cancelled = {op.name for op in scenario.ops if op.kind == "unschedule"}
    now = time.time()
    for op in scenario.ops:
        if op.kind != "schedule" or op.key not in acked:
            continue
        due = (parse_time(op.at) or 0.0) <= now and op.name not in cancelled
        count = users.count(op.name)
        if due and count != 1:
            result.violate(
                DELIVERED,
                f"schedule {op.name!r} (due {op.at}, acknowledged with {op.key!r}) was "
                f"delivered {count} times, not once",
            )
        elif not due and count:
            why = "cancelled" if op.name in cancelled else f"due {op.at}"
            result.violate(DELIVERED, f"schedule {op.name!r} ({why}) was delivered {count} times")
