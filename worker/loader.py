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
from worker.errors import BaselineError, InvalidLog, SessionIOError, SessionNotFound, TornLog
from worker.records import (
    EpochEnd,
    Record,
    SessionStart,
    ToolResult,
    User,
    decode_lines_fast,
    decode_record,
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


def read_file(path: str) -> bytes:
    """Return the bytes of ``path``; OS errors become SessionIOError with the path."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise SessionIOError(path, exc.errno or 0, "read") from exc


def list_epochs(session_dir: str) -> list[int]:
    """Return the epoch numbers that have a log, ascending; refuse gaps and odd names."""
    try:
        names = os.listdir(session_dir)
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


def decode_log(path: str, data: bytes) -> list[Record]:
    """Decode every line of a log; TornLog with the line number for the first bad one."""
    if not data:
        return []
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the data ends in a newline
    if tail:
        raise TornLog(path, len(lines) + 1, "last line has no newline (torn write)")
    with _cyclic_gc_paused():
        records = decode_lines_fast(lines)
    if records is not None:
        return records
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            records.append(decode_record(line))
        except ValueError as exc:
            raise TornLog(path, number, f"undecodable record: {exc}") from exc
    return records


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
            path, 1, f"SessionStart.session is {first.session!r}, directory is {session_id!r}"
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


def load_baseline(path: str, expected_hash: str) -> Baseline:
    """Read, hash and parse a baseline; BaselineError if missing, unparsable or mismatched."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError as exc:
        raise BaselineError(path, "baseline file is missing") from exc
    except OSError as exc:
        raise SessionIOError(path, exc.errno or 0, "read") from exc
    actual = hash_bytes(data)
    if actual != expected_hash:
        raise BaselineError(
            path, f"baseline hashes to {actual}, SessionStart.baseline says {expected_hash}"
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
) -> SessionState:
    """Read and check every epoch of the session in ``session_dir``; change nothing.

    ``on_epoch`` sees each epoch's checked records, oldest first (inspection counts them).
    """
    epochs = list_epochs(session_dir)
    newest = epochs[-1]
    carry: str | None = None
    prior_users = prior_untrusted = max_call = 0
    keys: dict[str, KeyRef] = {}
    sizes: list[int] = []
    records: list[Record] = []
    for epoch in epochs:
        path = log_path(session_dir, epoch)
        data = read_file(path)
        sizes.append(len(data))
        records = decode_log(path, data)
        check_epoch(path, session_id, epoch, records, newest=epoch == newest)
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
                    keys.setdefault(record.key, KeyRef(epoch, number))
                if epoch != newest:
                    prior_users += 1
                    prior_untrusted += record.untrusted
        if epoch != newest:
            last = records[-1]
            assert isinstance(last, EpochEnd)  # check_epoch guarantees it
            carry = last.summary
    first = records[0]
    assert isinstance(first, SessionStart)  # check_epoch guarantees it
    baseline = load_baseline(baseline_path(session_dir, newest), first.baseline)
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
