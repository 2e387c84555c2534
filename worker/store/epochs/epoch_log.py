"""One epoch's log: decode its lines and check its structure, changing nothing.

The first problem is raised as TornLog or InvalidLog with its place; the session-level
reading (which epochs, the baseline, the state carried between epochs) is
``worker.store.loader``'s.
"""

from __future__ import annotations

import gc
import os
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from worker.store.disk.files import Directory, read_file
from worker.store.errors import InvalidLog, TornLog, quote
from worker.store.format.app_records import check_apps
from worker.store.format.dataclass_methods import MutableValue
from worker.store.format.epoch_records import EpochRecords
from worker.store.format.line_checksums import chain_line
from worker.store.format.line_scan import LineScan, scan_lines
from worker.store.format.records import (
    EpochEnd,
    Record,
    SessionStart,
    ToolResult,
    User,
    decode_line_checksum,
    decode_lines_fast,
)
from worker.store.format.scan_summary import ScanSummary


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while a log is decoded or scanned, then restore its state.

    Decoding allocates one container per line and keeps them all; each allocation
    burst would trigger collections that rescan every record kept so far, making a
    large open superlinear. The scan's passes allocate a tuple per line and the
    loader an entry per key: a collection every 700 of them. Records reference only
    strings and numbers, so no cycle can form while the collector is paused.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass(slots=True, repr=False, eq=False)
class DecodedLog(MutableValue):
    """One epoch log's records, ``(index, part, parts)`` for each line of a group, and
    the CRC-32 of all the log's bytes (what the next line's checksum continues)."""

    records: list[Record]
    framed: list[tuple[int, int, int]]
    crc: int = 0


def decode_log(path: str, data: bytes, *, canonical: bool = False) -> DecodedLog:
    """Decode and check every line of a log; TornLog or ChecksumMismatch at the first bad one.

    ``canonical``: every line must be the writer's own bytes for its record, even one
    whose checksum matches (``loopd verify``); without it a checksummed line's spelling
    is trusted when the whole log decodes at once (docs/format.md, "What each reader
    checks").

    A last line without its newline is reported only when every line before it decodes
    and checks: the error always names the first bad line of the file.
    """
    if not data:
        return DecodedLog([], [])
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the data ends in a newline
    if not tail:
        with cyclic_gc_paused():
            fast = decode_lines_fast(data, lines, canonical=canonical)
        if fast is not None:
            return DecodedLog(fast[0], [], fast[1])  # its groups are already proven whole
    records: list[Record] = []
    framed: list[tuple[int, int, int]] = []
    running = summed_from = 0
    for number, line in enumerate(lines, start=1):
        try:
            record, part, crc = decode_line_checksum(line)
        except ValueError as exc:
            raise TornLog(path, number, f"undecodable record: {exc}") from exc
        running = chain_line(path, number, line, crc, running, summed_from)
        if crc is not None and not summed_from:
            summed_from = number
        if part is not None:
            framed.append((number - 1, *part))
        records.append(record)
    if tail:
        raise TornLog(path, len(lines) + 1, "last line has no newline (torn write)")
    return DecodedLog(records, framed, running)


@dataclass(slots=True, repr=False, eq=False)
class ReadLog(MutableValue):
    """One epoch log as open reads it: its records (decoded when asked for), the CRC-32
    of its bytes, its ToolResults' call numbers, the line of each User and its key.

    ``users`` and ``keys`` are two lists, not one of pairs: the loader indexes the keys
    with them in C (a pair per User was an allocation each, and the cyclic GC's work
    once the load ended)."""

    records: EpochRecords
    crc: int
    calls: list[int]
    users: list[int]
    keys: list[str | None]
    scan: LineScan | None = None  # the scan's, when the log was proven by one


def read_log(
    path: str,
    data: bytes,
    session_id: str,
    epoch: int,
    *,
    newest: bool,
    canonical: bool,
    known: ScanSummary | None = None,
) -> ReadLog:
    """Read and check one epoch's log (``check_epoch``, its groups), decoding no record.

    Proven by the scan (``worker.store.format.line_scan``) unless asked for every
    line's spelling (verify) or a line is not what the scan knows: then decoded line by
    line, which names the first problem (docs/format.md, "What each reader checks").
    ``known``: a summary of an earlier scan of this log (``scan_lines``).
    """
    scan = None if canonical else scan_lines(data, known, epoch)
    if scan is None:
        decoded = decode_log(path, data, canonical=canonical)
        records = EpochRecords.decoded(path, decoded.records)
        check_epoch(path, session_id, epoch, records, newest=newest)
        check_groups(path, decoded.records, decoded.framed)
        calls = [r.call for r in decoded.records if type(r) is ToolResult]
        users = [(n, r.key) for n, r in enumerate(decoded.records, 1) if isinstance(r, User)]
        lines, keys = [n for n, _key in users], [key for _n, key in users]
        return ReadLog(records, decoded.crc, calls, lines, keys)
    records = EpochRecords(path, [None] * len(scan.types), scan.types, data, scan.keys)
    check_epoch(path, session_id, epoch, records, newest=newest)
    return ReadLog(records, scan.crc, scan.calls, scan.users, scan.keys, scan)


def check_groups(path: str, records: list[Record], framed: list[tuple[int, int, int]]) -> None:
    """Check that every group commit in the log is whole: parts 1..n on consecutive lines.

    A group cut short at the end of the log is what a torn or lost write leaves:
    TornLog at its first line. Any other break (a part out of place, a SessionStart or
    EpochEnd inside a group) is InvalidLog.
    """
    expected_index = expected_part = parts = 0  # the next line of an open group
    start = 0
    for index, part, size in framed:
        if expected_part:
            if index != expected_index:
                raise InvalidLog(
                    path,
                    expected_index + 1,
                    f"line {start + 1} starts a group of {parts} lines, but this line is "
                    "not its next part",
                )
            if part != expected_part or size != parts:
                raise InvalidLog(
                    path, index + 1, f"part {part} of {size} where part {expected_part} of "
                    f"{parts} (the group of line {start + 1}) belongs",
                )  # fmt: skip
        elif part != 1:
            raise InvalidLog(
                path, index + 1, f"part {part} of {size} of a group whose first part is missing"
            )
        else:
            start, parts = index, size
        record = records[index]
        if isinstance(record, SessionStart | EpochEnd):
            raise InvalidLog(path, index + 1, f"{record.TYPE} is written alone, never in a group")
        if part == size:
            expected_part = 0
        else:
            expected_index, expected_part = index + 1, part + 1
            if expected_index == len(records):
                raise TornLog(
                    path,
                    start + 1,
                    f"incomplete group: lines {start + 1}-{index + 1} are parts 1-{part} of "
                    f"{parts} written together (torn write); the group was never acknowledged",
                )
    if expected_part:
        raise InvalidLog(
            path,
            expected_index + 1,
            f"line {start + 1} starts a group of {parts} lines, but this line is not its next part",
        )


def session_of_sealed(following: SessionStart | None, session_id: str) -> str:
    """The id sealed epoch n's SessionStart must name, given epoch n+1's: the same as it,
    or the session it was forked from (``forked_from``); ``session_id`` (the directory's)
    when epoch n+1's first line is not a SessionStart (refused when it is read itself)."""
    if following is None:
        return session_id
    return following.forked_from or following.session


def check_epoch(
    path: str, session_id: str, epoch: int, records: Sequence[Record], *, newest: bool
) -> None:
    """Check one epoch's structure; InvalidLog with the offending line."""
    if not records:
        raise InvalidLog(path, 1, "empty log: the first record must be SessionStart")
    first = records[0]
    if not isinstance(first, SessionStart):
        raise InvalidLog(path, 1, f"first record is {first.TYPE}, not SessionStart")
    if first.epoch != epoch:
        raise InvalidLog(path, 1, f"SessionStart.epoch is {first.epoch}, file is epoch {epoch}")
    if first.session != session_id:
        raise InvalidLog(
            path, 1, f"SessionStart.session is {quote(first.session)}, directory is {session_id!r}"
        )
    if first.forked_from is not None and (first.forked_from == first.session or epoch == 0):
        raise InvalidLog(
            path, 1, f"SessionStart.forked_from is {quote(first.forked_from)}: not a fork's"
        )
    # The types once, then counted in C: a large log is checked without a Python step
    # (or a decode) per record, and the place of a problem is looked up only when there
    # is one.
    types = records.types if isinstance(records, EpochRecords) else list(map(type, records))
    check_apps(path, records, types)
    if types.count(SessionStart) > 1:
        raise InvalidLog(path, types.index(SessionStart, 1) + 1, "a second SessionStart")
    if EpochEnd in types:
        number = types.index(EpochEnd) + 1
        if number != len(records):
            raise InvalidLog(path, number, "EpochEnd is not the last record")
        closing = records[-1]
        assert isinstance(closing, EpochEnd)
        if closing.next != epoch + 1:
            raise InvalidLog(path, number, f"EpochEnd.next is {closing.next}, expected {epoch + 1}")
    if not newest and not isinstance(records[-1], EpochEnd):
        raise InvalidLog(
            path, len(records), f"epoch {epoch} is not the newest but does not end with EpochEnd"
        )


def key_applied_at(dir_fd: Directory, path: str, line: int, key: str) -> bool:
    """True if line ``line`` of the log at ``path`` is a User applying the request ``key``.

    How a hit of the key index is confirmed: the log is the state. A line that does
    not decode, or whose checksum does not match the log before it, is refused
    (InvalidLog); one that holds another record or another key is a hash collision
    (False).
    """
    data = read_file(dir_fd, os.path.basename(path), path)
    start = 0
    for _ in range(line - 1):
        start = data.find(b"\n", start) + 1
        if start == 0:
            return False
    end = data.find(b"\n", start)
    if end < 0:
        return False
    text = data[start:end]
    try:
        record, _part, crc = decode_line_checksum(text)
    except ValueError as exc:
        raise InvalidLog(path, line, f"undecodable record: {exc}") from exc
    if crc is not None:
        chain_line(path, line, text, crc, zlib.crc32(memoryview(data)[:start]), 0)
    return isinstance(record, User) and record.key == key


def refuse_reused_call(path: str, records: Sequence[Record], floor: int) -> None:
    """Raise InvalidLog at the first ToolResult whose call number is below ``floor`` or not new."""
    highest = floor - 1
    for number, record in enumerate(records, start=1):
        if isinstance(record, ToolResult):
            if record.call <= highest:
                raise InvalidLog(
                    path,
                    number,
                    f"ToolResult.call {record.call} reuses a call number (the next free "
                    f"one is {highest + 1})",
                )
            highest = record.call
