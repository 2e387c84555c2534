"""An epoch step's first line: the new epoch's ``SessionStart``, checked before it is written."""

from __future__ import annotations

import dataclasses

from worker.store.baseline import hash_bytes
from worker.store.errors import LogError, quote
from worker.store.line_checksums import chain_line
from worker.store.records import SessionStart, decode_line_checksum
from worker.store.replica_types import ReplicaRefused, Step
from worker.store.session_state import log_path


def check_first_line(directory: str, step: Step) -> SessionStart:
    """The step's log must be one checksummed ``SessionStart`` line naming its session,
    its epoch and the hash of the step's baseline; return it (ReplicaRefused if not)."""
    path = log_path(directory, step.epoch)
    data = step.data
    if data.count(b"\n") != 1 or not data.endswith(b"\n"):
        raise ReplicaRefused(path, "an epoch step's log must be its SessionStart line alone")
    line = data[:-1]
    try:
        record, part, stored = decode_line_checksum(line)
    except ValueError as exc:
        raise ReplicaRefused(path, f"line 1: undecodable record: {exc}") from exc
    if not isinstance(record, SessionStart) or part is not None:
        raise ReplicaRefused(path, f"line 1 is {record.TYPE}, not a SessionStart written alone")
    if stored is None:
        raise ReplicaRefused(path, "line 1: a shipped line must carry its checksum")
    try:
        chain_line(path, 1, line, stored, 0, 1)
    except LogError as exc:
        raise ReplicaRefused(path, f"line 1: {exc.why}") from exc
    if record.session != step.session or record.epoch != step.epoch:
        raise ReplicaRefused(
            path,
            f"the SessionStart is of session {quote(record.session)} epoch {record.epoch}, "
            f"the step of {step.session!r} epoch {step.epoch}",
        )
    assert step.baseline is not None
    actual = hash_bytes(step.baseline)
    if record.baseline != actual:
        raise ReplicaRefused(
            path, f"the step's baseline hashes to {actual}, its SessionStart says {record.baseline}"
        )
    if step.epoch == 0:
        plain = SessionStart(
            time=record.time, session=record.session, epoch=0, slot=record.slot,
            baseline=record.baseline,
        )  # fmt: skip
        if record != plain:
            raise ReplicaRefused(path, "epoch 0's SessionStart carries no state from before")
    return record


def describe_difference(expected: SessionStart, actual: SessionStart) -> str:
    """Name the first field in which ``actual`` is not what the copy expected."""
    for field in dataclasses.fields(SessionStart):
        want, got = getattr(expected, field.name), getattr(actual, field.name)
        if want != got:
            return f"{field.name} is {quote(got, 80)}, the copy carries {quote(want, 80)}"
    return "they differ"
