"""The checks a follower's copy makes of shipped lines before it writes a byte of them.

The bytes must be whole lines, each the canonical encoding of its record and carrying
its checksum, chained from the CRC-32 of the copy's log (so they continue exactly the
bytes the copy holds); whole groups (a group cut short is refused, not written); and,
appended to the copy, a log that open accepts: no ``SessionStart``, an ``EpochEnd``
only last and binding the state the copy would then carry, tokens never going
backwards, no tool call number or request key used twice in any epoch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from worker.store.carried_checks import check_planned_digest
from worker.store.epoch_log import check_groups
from worker.store.errors import LogError, quote
from worker.store.fencing import Fence, advance
from worker.store.line_checksums import chain_line
from worker.store.records import (
    EpochEnd,
    Handoff,
    Owner,
    Record,
    SessionStart,
    ToolResult,
    User,
    decode_line_checksum,
)
from worker.store.replica_types import ReplicaRefused
from worker.store.session_state import KeyRef, SessionState


@dataclass(slots=True)
class Chunk:
    """Shipped lines, checked: their records, and what the copy's state becomes with them."""

    records: list[Record]
    crc: int  # of the copy's log once they are appended
    fence: Fence
    max_call: int
    keys: dict[str, KeyRef]  # the request keys they apply, with their lines


def check_chunk(
    state: SessionState, path: str, data: bytes, applied: Callable[[str], bool]
) -> Chunk:
    """Check ``data`` as lines appended to ``state``'s log at ``path``; ReplicaRefused if not.

    ``applied`` says whether a key was applied in a sealed epoch (the key index).
    """
    base = len(state.records)
    if not data:
        raise ReplicaRefused(path, "the step holds no line")
    if not data.endswith(b"\n"):
        last = base + data.count(b"\n") + 1
        raise ReplicaRefused(path, f"the step's last line (line {last}) has no newline (torn)")
    if isinstance(state.records[-1], EpochEnd):
        raise ReplicaRefused(
            path, f"epoch {state.epoch} ends with EpochEnd: only the next epoch's files may follow"
        )
    records: list[Record] = []
    framed: list[tuple[int, int, int]] = []
    running = state.log_crc
    for index, line in enumerate(data[:-1].split(b"\n")):
        number = base + index + 1
        try:
            record, part, stored = decode_line_checksum(line)
        except ValueError as exc:
            raise ReplicaRefused(path, f"line {number}: undecodable record: {exc}") from exc
        if stored is None:
            raise ReplicaRefused(path, f"line {number}: a shipped line must carry its checksum")
        try:
            running = chain_line(path, number, line, stored, running, 1)
        except LogError as exc:
            raise ReplicaRefused(
                path, f"line {number}: does not continue the copy's chain: {exc.why}"
            ) from exc
        if part is not None:
            framed.append((index, *part))
        records.append(record)
    try:
        check_groups(path, records, framed)
    except LogError as exc:
        raise ReplicaRefused(
            path, f"line {base + exc.line}: not whole group commits: {exc.why}"
        ) from exc
    chunk = Chunk(records, running, state.fence, state.max_call, {})
    in_group = {index for index, _part, _parts in framed}
    for index, record in enumerate(records):
        _check_record(state, path, chunk, base + index + 1, record, index in in_group, applied)
    closing = records[-1]
    if isinstance(closing, EpochEnd):
        _check_epoch_end(state, path, chunk, closing)
    return chunk


def _check_record(
    state: SessionState,
    path: str,
    chunk: Chunk,
    number: int,
    record: Record,
    framed: bool,
    applied: Callable[[str], bool],
) -> None:
    """One shipped record against the copy's state and the records before it."""
    if isinstance(record, SessionStart):
        raise ReplicaRefused(path, f"line {number}: a SessionStart is an epoch's first line only")
    if isinstance(record, EpochEnd) and record is not chunk.records[-1]:
        raise ReplicaRefused(path, f"line {number}: EpochEnd is not the last record")
    if isinstance(record, Owner | Handoff) or chunk.fence.sealed is not None:
        if isinstance(record, Owner | Handoff) and framed:
            raise ReplicaRefused(path, f"line {number}: {record.TYPE} is written alone")
        fenced = advance(chunk.fence, record)
        if isinstance(fenced, str):
            raise ReplicaRefused(path, f"line {number}: {fenced}")
        chunk.fence = fenced
    if isinstance(record, ToolResult):
        floor = max(chunk.max_call + 1, state.next_call)
        if record.call < floor:
            raise ReplicaRefused(
                path,
                f"line {number}: ToolResult.call {record.call} reuses a number (the next "
                f"free one is {floor})",
            )
        chunk.max_call = record.call
    elif isinstance(record, User) and record.key is not None:
        key = record.key
        if key in chunk.keys or key in state.keys or applied(key):
            raise ReplicaRefused(
                path, f"line {number}: request key {quote(key, 80)} is already in the log"
            )
        chunk.keys[key] = KeyRef(state.epoch, number)


def _check_epoch_end(state: SessionState, path: str, chunk: Chunk, end: EpochEnd) -> None:
    """The EpochEnd must lead to the next epoch and bind what the copy would carry there."""
    line = len(state.records) + len(chunk.records)
    if end.next != state.epoch + 1:
        raise ReplicaRefused(
            path, f"line {line}: EpochEnd.next is {end.next}, expected {state.epoch + 1}"
        )
    after = dataclasses.replace(
        state,
        records=[*state.records, *chunk.records],
        keys={**state.keys, **chunk.keys},
        max_call=chunk.max_call,
        next_call=max(state.next_call, chunk.max_call + 1),
        fence=chunk.fence,
    )
    try:
        check_planned_digest(path, line, end, after)
    except LogError as exc:
        raise ReplicaRefused(path, f"line {line}: {exc.why}") from exc
