"""Read-only inspection of a session: what open would load, without taking the writer's lock."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from worker.store.disk.layout import session_dir
from worker.store.disk.lock import lock_directory, unlock_directory
from worker.store.errors import SessionLocked, SessionNotFound
from worker.store.format.records import Record
from worker.store.format.records_view import typed
from worker.store.loader import load_session, log_path
from worker.store.schedules import pending_schedules
from worker.store.session_state import SessionState


@dataclass(frozen=True, slots=True, kw_only=True)
class EpochSummary:
    """One epoch's log: its number, size and record counts by type."""

    epoch: int
    path: str
    size: int
    counts: dict[str, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class Inspection:
    """What a read-only look at a session found."""

    session: str
    directory: str
    epoch: int
    slot: int
    carry: str | None
    next_call: int
    prior_users: int
    prior_untrusted: int
    records: int
    epoch_closed: bool
    writer_pid: int | None
    writer_live: bool
    epochs: list[EpochSummary] = field(default_factory=list)
    # The pending schedules, soonest first: {key, at, text, untrusted} each.
    schedules: list[dict[str, object]] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        """Return a JSON-ready dict of the inspection."""
        return {
            "session": self.session,
            "directory": self.directory,
            "epoch": self.epoch,
            "slot": self.slot,
            "carry": self.carry,
            "next_call": self.next_call,
            "prior_users": self.prior_users,
            "prior_untrusted": self.prior_untrusted,
            "records": self.records,
            "epoch_closed": self.epoch_closed,
            "writer_live": self.writer_live,
            "writer_pid": self.writer_pid,
            "epochs": [
                {"epoch": e.epoch, "path": e.path, "size": e.size, "counts": e.counts}
                for e in self.epochs
            ],
            "schedules": self.schedules,
        }


def inspect_session(
    home: str | os.PathLike[str], session_id: str, *, history: bool = False
) -> Inspection:
    """Load a session read-only under LOCK_SH; say so when a writer holds it.

    Raises what ``Session.open`` would (TornLog, InvalidLog, BaselineError, ...). Reads
    what open reads (the newest epoch, when it carries the state of the older ones), or
    with ``history`` every epoch, checking every carried field and every line's
    canonical form (docs/format.md, "What each reader checks").
    While a writer is live its last line may be mid-write, so a TornLog then can be
    a false alarm; ``writer_live`` lets the caller say so.
    """
    directory = session_dir(home, session_id)
    if not os.path.isdir(directory):
        raise SessionNotFound(directory)
    writer_pid: int | None = None
    writer_live = False
    try:
        lock_fd: int | None = lock_directory(directory, shared=True)
    except SessionLocked as exc:
        lock_fd, writer_live, writer_pid = None, True, exc.pid
    counts: list[dict[str, int]] = []

    def count_epoch(records: Sequence[Record]) -> None:
        counts.append(type_counts(records))

    try:
        # The history (verify, inspect --all) is the thorough check: every line's
        # spelling too. The newest alone is what open reads, checked as open checks it.
        state = load_session(directory, session_id, on_epoch=count_epoch, dir_fd=lock_fd,
                             history=history, canonical=history)  # fmt: skip
    finally:
        if lock_fd is not None:
            unlock_directory(lock_fd)
    return summarize(state, directory, counts, writer_pid=writer_pid, writer_live=writer_live)


def summarize(
    state: SessionState,
    directory: str,
    counts: list[dict[str, int]],
    *,
    writer_pid: int | None = None,
    writer_live: bool = False,
) -> Inspection:
    """The inspection of a loaded session; ``counts``: each epoch read's, oldest first."""
    session_id = state.session_id
    return Inspection(
        session=session_id,
        directory=directory,
        epoch=state.epoch,
        slot=state.slot,
        carry=state.carry,
        next_call=state.next_call,
        prior_users=state.prior_users,
        prior_untrusted=state.prior_untrusted,
        records=len(state.records),
        epoch_closed=state.records[-1].TYPE == "EpochEnd",
        writer_pid=writer_pid,
        writer_live=writer_live,
        epochs=[
            EpochSummary(epoch=n, path=log_path(directory, n), size=size, counts=counts[i])
            for i, (n, size) in enumerate(enumerate(state.epoch_sizes, start=state.first_read))
        ],
        schedules=[
            {"key": s.key, "at": s.at, "text": s.text, "untrusted": s.untrusted}
            for s in sorted(pending_schedules(state.records).values(), key=lambda s: s.at)
        ],
    )


def type_counts(records: Sequence[Record]) -> dict[str, int]:
    """How many records of each type an epoch holds (an open epoch's: none decoded)."""
    epoch = typed(records)
    if epoch is not None:
        return dict(Counter(cls.TYPE for cls in epoch.types))
    return dict(Counter(record.TYPE for record in records))
