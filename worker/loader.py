"""Read and validate a session directory without changing a byte of it.

``load_session`` is the whole of ``open``'s reading: every epoch log is decoded and
checked line by line, the structure of the epochs is checked, and the newest epoch's
baseline is hashed. Nothing is repaired: the first problem is raised as TornLog,
InvalidLog or BaselineError with its place.
"""

from __future__ import annotations

import errno
import gc
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final

from worker.baseline import Baseline, hash_bytes
from worker.errors import (
    BaselineError,
    InvalidLog,
    SessionIOError,
    SessionNotFound,
    TornLog,
    quote,
)
from worker.files import open_directory, read_file
from worker.records import (
    EpochEnd,
    Record,
    SessionStart,
    ToolResult,
    User,
    decode_line,
    decode_lines_fast,
)

_LOG_NAME: Final = re.compile(r"(0|[1-9][0-9]*)\.jsonl")
_DIGITS_LOG: Final = re.compile(r"[0-9]+\.jsonl")
_MISSING: Final = frozenset({errno.ENOENT})


def log_path(session_dir: str, epoch: int) -> str:
    """Return the path of epoch ``epoch``'s log."""
    return os.path.join(session_dir, f"{epoch}.jsonl")


def baseline_path(session_dir: str, epoch: int) -> str:
    """Return the path of epoch ``epoch``'s baseline."""
    return os.path.join(session_dir, f"{epoch}.baseline.json")


@dataclass(slots=True)
class KeyRef:
    """Where a request key was applied: its epoch and line (from 1) in that epoch's log."""

    epoch: int
    line: int


@dataclass(slots=True)
class SessionState:
    """Everything ``open`` learns from the files of a session."""

    session_id: str
    directory: str
    epoch: int
    slot: int
    baseline: Baseline
    records: list[Record]
    log_size: int
    carry: str | None
    prior_users: int = 0
    prior_untrusted: int = 0
    max_call: int = 0
    keys: dict[str, KeyRef] = field(default_factory=dict)
    epoch_sizes: list[int] = field(default_factory=list)


def list_epochs(session_dir: str, dir_fd: int | None = None) -> list[int]:
    """Return the epoch numbers that have a log, ascending; refuse gaps and odd names."""
    try:
        names = os.listdir(session_dir if dir_fd is None else dir_fd)
    except OSError as exc:
        if exc.errno in _MISSING:
            raise SessionNotFound(session_dir) from exc
        raise SessionIOError(session_dir, exc.errno or 0, "list directory") from exc
    epochs = []
    for name in names:
        if _LOG_NAME.fullmatch(name):
            epochs.append(int(name[: -len(".jsonl")]))
        elif _DIGITS_LOG.fullmatch(name):
            raise InvalidLog(os.path.join(session_dir, name), 1, "epoch number has a leading zero")
    epochs.sort()
    if not epochs:
        raise SessionNotFound(session_dir)
    if epochs[0] != 0:
        raise InvalidLog(
            log_path(session_dir, epochs[0]), 1, "0.jsonl is missing: the log has no first epoch"
        )
    for expected, epoch in enumerate(epochs):
        if epoch != expected:
            raise InvalidLog(
                log_path(session_dir, epoch),
                1,
                f"gap in epochs: {expected}.jsonl is missing before {epoch}.jsonl",
            )
    return epochs


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while a log is decoded, then restore its previous state.

    Decoding allocates one container per line and keeps them all; each allocation
    burst would trigger collections that rescan every record kept so far, making a
    large open superlinear. Records reference only strings and numbers, so no cycle
    can form while the collector is paused.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass(slots=True)
class DecodedLog:
    """One epoch log's records, and ``(index, part, parts)`` for each line of a group."""

    records: list[Record]
    framed: list[tuple[int, int, int]]


def decode_log(path: str, data: bytes) -> DecodedLog:
    """Decode every line of a log; TornLog with the line number of the first bad one.

    A last line without its newline is reported only when every line before it decodes:
    the error always names the first bad line of the file.
    """
    if not data:
        return DecodedLog([], [])
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the data ends in a newline
    if not tail:
        with _cyclic_gc_paused():
            fast = decode_lines_fast(lines)
        if fast is not None:
            return DecodedLog(*fast)
    records: list[Record] = []
    framed: list[tuple[int, int, int]] = []
    for number, line in enumerate(lines, start=1):
        try:
            record, part = decode_line(line)
        except ValueError as exc:
            raise TornLog(path, number, f"undecodable record: {exc}") from exc
        if part is not None:
            framed.append((number - 1, *part))
        records.append(record)
    if tail:
        raise TornLog(path, len(lines) + 1, "last line has no newline (torn write)")
    return DecodedLog(records, framed)


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


def check_epoch(
    path: str, session_id: str, epoch: int, records: list[Record], *, newest: bool
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
    for number, record in enumerate(records[1:], start=2):
        if isinstance(record, SessionStart):
            raise InvalidLog(path, number, "a second SessionStart")
        if isinstance(record, EpochEnd):
            if number != len(records):
                raise InvalidLog(path, number, "EpochEnd is not the last record")
            if record.next != epoch + 1:
                raise InvalidLog(
                    path, number, f"EpochEnd.next is {record.next}, expected {epoch + 1}"
                )
    if not newest and not isinstance(records[-1], EpochEnd):
        raise InvalidLog(
            path, len(records), f"epoch {epoch} is not the newest but does not end with EpochEnd"
        )


def load_baseline(dir_fd: int, path: str, expected_hash: str) -> Baseline:
    """Read, hash and parse a baseline; BaselineError if missing, unparsable or mismatched."""
    try:
        data = read_file(dir_fd, os.path.basename(path), path)
    except SessionIOError as exc:
        if exc.errno in _MISSING:
            raise BaselineError(path, "baseline file is missing") from exc
        raise
    actual = hash_bytes(data)
    if actual != expected_hash:
        raise BaselineError(
            path,
            f"baseline hashes to {actual}, SessionStart.baseline says {quote(expected_hash, 80)}",
        )
    try:
        return Baseline.from_json(data)
    except ValueError as exc:
        raise BaselineError(path, f"baseline is unparsable: {exc}") from exc


def load_session(
    session_dir: str,
    session_id: str,
    *,
    on_epoch: Callable[[list[Record]], None] | None = None,
    dir_fd: int | None = None,
    newest_data: bytes | None = None,
) -> SessionState:
    """Read and check every epoch of the session in ``session_dir``; change nothing.

    Files are read relative to ``dir_fd`` (the session directory's open fd, e.g. the
    one holding its lock), or to an fd of ``session_dir`` opened without following a
    link. ``on_epoch`` sees each epoch's checked records, oldest first. With
    ``newest_data`` those bytes stand for the newest log's (repair checks a cut with it).
    """
    if dir_fd is not None:
        return _load(session_dir, session_id, on_epoch, dir_fd, newest_data)
    own_fd = open_directory(session_dir)
    try:
        return _load(session_dir, session_id, on_epoch, own_fd, newest_data)
    finally:
        os.close(own_fd)


def _load(
    session_dir: str,
    session_id: str,
    on_epoch: Callable[[list[Record]], None] | None,
    dir_fd: int,
    newest_data: bytes | None,
) -> SessionState:
    epochs = list_epochs(session_dir, dir_fd)
    newest = epochs[-1]
    carry: str | None = None
    prior_users = prior_untrusted = max_call = 0
    keys: dict[str, KeyRef] = {}
    sizes: list[int] = []
    records: list[Record] = []
    for epoch in epochs:
        path = log_path(session_dir, epoch)
        if newest_data is not None and epoch == newest:
            data = newest_data
        else:
            data = read_file(dir_fd, os.path.basename(path), path)
        sizes.append(len(data))
        decoded = decode_log(path, data)
        records = decoded.records
        check_epoch(path, session_id, epoch, records, newest=epoch == newest)
        check_groups(path, records, decoded.framed)
        if on_epoch is not None:
            on_epoch(records)
        for number, record in enumerate(records, start=1):
            if isinstance(record, ToolResult):
                if record.call <= max_call:
                    raise InvalidLog(
                        path,
                        number,
                        f"ToolResult.call {record.call} reuses a call number "
                        f"(the highest before it is {max_call})",
                    )
                max_call = record.call
            elif isinstance(record, User):
                if record.key is not None:
                    first_use = keys.get(record.key)
                    if first_use is not None:
                        raise InvalidLog(
                            path,
                            number,
                            f"request key {quote(record.key, 80)} was already applied "
                            f"(epoch {first_use.epoch}, line {first_use.line}): a request is "
                            "applied once",
                        )
                    keys[record.key] = KeyRef(epoch, number)
                if epoch != newest:
                    prior_users += 1
                    prior_untrusted += record.untrusted
        if epoch != newest:
            last = records[-1]
            assert isinstance(last, EpochEnd)  # check_epoch guarantees it
            carry = last.summary
    first = records[0]
    assert isinstance(first, SessionStart)  # check_epoch guarantees it
    baseline = load_baseline(dir_fd, baseline_path(session_dir, newest), first.baseline)
    return SessionState(
        session_id=session_id,
        directory=session_dir,
        epoch=newest,
        slot=first.slot,
        baseline=baseline,
        records=records,
        log_size=sizes[-1],
        carry=carry,
        prior_users=prior_users,
        prior_untrusted=prior_untrusted,
        max_call=max_call,
        keys=keys,
        epoch_sizes=sizes,
    )
