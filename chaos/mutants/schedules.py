"""Mutants of scheduled requests: schedules lost at an epoch commit, or delivered early."""

from __future__ import annotations

from collections.abc import Sequence

from worker.store.format.records import Record, Schedule


def carried_schedules_forgotten() -> None:
    from worker.store.epochs import epoch_commit  # noqa: PLC0415 - patched in the child only

    def carried_schedules(records: Sequence[Record]) -> list[Schedule]:
        # The bug: the epoch commit carries no pending schedule into the next epoch's
        # log, so a schedule made before the commit is never found again.
        return []

    epoch_commit.carried_schedules = carried_schedules  # type: ignore[attr-defined]


def delivered_without_waiting() -> None:
    from worker.loop import schedule_book  # noqa: PLC0415 - patched in the child only

    def due(self: schedule_book.ScheduleBook, now: float) -> list[Schedule]:
        # The bug: every pending schedule is taken as due, whatever its time.
        return sorted(self.pending().values(), key=lambda s: s.at)

    schedule_book.ScheduleBook.due = due  # type: ignore[method-assign]
