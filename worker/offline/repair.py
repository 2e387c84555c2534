"""Explicit repair, only on an operator's request: move a damaged last group out of the log.

A crash mid-write, or a power loss after it, can leave the newest log's last group
commit damaged: a line without its newline, a group cut short, or (on a disk that
persists a later part of a write before an earlier one) zeros in front of the group's
last lines. Nothing in that group was acknowledged (acknowledgement follows the fsync
of a whole group), so it can be moved, byte for byte, into
``<home>/quarantine/<id>/`` and the log cut back to the end of its last whole group.

Everything is checked before anything changes: the damage must be confined to the
last group (no whole group after it), and the session that would remain must open.
Anything else, above all a bad line in the middle of a log, is refused: that is damage
to acknowledged data and needs a human and a backup.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from worker.offline.salvage_plan import PLAN_NAME, plan_present, unfinished_why
from worker.store.disk import durable
from worker.store.disk.files import read_file
from worker.store.disk.layout import session_dir
from worker.store.disk.lock import lock_directory, unlock_directory
from worker.store.errors import LogError, PathError, SessionError, SessionLocked, TornLog
from worker.store.format.records import EpochEnd, Record, SessionStart, User, decode_line
from worker.store.loader import list_epochs, load_session, log_path

QUARANTINE_DIR: Final = "quarantine"
_NEVER_IN_PLACE: Final = (
    "It is never repaired in place: restore the session from a backup (loopd restore), "
    "or keep the prefix that opens with loopd salvage (what it cuts may hold acknowledged "
    "work), or move it aside with its files intact"
)


class RepairRefused(PathError):
    """Repair will not touch this session; ``why`` says what to do instead."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RepairResult:
    """What repair moved: from which log and lines, how many bytes, to which file."""

    log: str
    line: int  # the first line moved (from 1)
    last_line: int  # the last line moved, a torn one included
    moved_bytes: int
    quarantine: str
    kept_bytes: int
    readable: tuple[str, ...]  # the moved records that still decode, e.g. "User key=k1"
    keys: tuple[str, ...] = ()  # the keys of the moved User records that still decode


@dataclass(frozen=True, slots=True)
class _Cut:
    offset: int  # bytes kept
    first_line: int
    last_line: int
    readable: tuple[str, ...]
    keys: tuple[str, ...]


def repair_torn_tail(home: str | os.PathLike[str], session_id: str) -> RepairResult:
    """Move the newest log's damaged last group into quarantine; refuse anything else."""
    directory = session_dir(home, session_id)
    try:
        lock_fd = lock_directory(directory)
    except SessionLocked as exc:
        holder = f"pid {exc.pid}" if exc.pid is not None else "another process"
        raise RepairRefused(
            directory,
            f"the session is held by {holder}; stop its worker first (loopd stop {session_id})",
        ) from exc
    try:
        return _repair_locked(os.fspath(home), directory, session_id, lock_fd)
    finally:
        unlock_directory(lock_fd)


def _repair_locked(home: str, directory: str, session_id: str, dir_fd: int) -> RepairResult:
    if plan_present(directory, dir_fd):  # half cut: only salvage may finish it
        raise RepairRefused(os.path.join(directory, PLAN_NAME), unfinished_why(directory))
    try:
        load_session(directory, session_id, dir_fd=dir_fd)
    except TornLog as exc:
        torn = exc
    except LogError as exc:
        raise _not_a_torn_tail(exc) from exc
    except SessionError as exc:
        raise RepairRefused(
            directory, f"{exc}; repair only moves a damaged last group of the newest log"
        ) from exc
    else:
        raise RepairRefused(directory, "the session opens cleanly: nothing to repair")
    epochs = list_epochs(directory, dir_fd)
    newest = log_path(directory, epochs[-1])
    if torn.path != newest:
        raise _not_a_torn_tail(torn)
    data = read_file(dir_fd, os.path.basename(newest), newest)
    cut = find_cut(newest, data, torn)
    keep = data[: cut.offset]
    # Check that the session that would remain opens before changing anything.
    try:
        load_session(directory, session_id, dir_fd=dir_fd, newest_data=keep)
    except LogError as exc:
        raise _not_a_torn_tail(exc) from exc
    except SessionError as exc:
        raise RepairRefused(
            directory, f"after the cut the session would still be refused: {exc}; nothing changed"
        ) from exc
    tail = data[cut.offset :]
    target_dir = os.path.join(home, QUARANTINE_DIR, session_id)
    make_dirs(target_dir)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    target = os.path.join(target_dir, f"{stamp}-{epochs[-1]}.jsonl.torn")
    durable.write_file_atomic(target, tail)
    fd = durable.open_append(newest)
    try:
        durable.truncate(fd, len(keep), newest)
    finally:
        durable.close(fd)
    load_session(directory, session_id, dir_fd=dir_fd)  # the repaired session must open
    return RepairResult(
        log=newest,
        line=cut.first_line,
        last_line=cut.last_line,
        moved_bytes=len(tail),
        quarantine=target,
        kept_bytes=len(keep),
        readable=cut.readable,
        keys=cut.keys,
    )


def find_cut(path: str, data: bytes, torn: LogError) -> _Cut:
    """Find where the last whole group ends; refuse unless only the last group is damaged.

    Lines are read in order until the first one that does not decode (or the torn last
    line). The cut is at the end of the last whole group before it. What follows the
    cut must be one group's remains: lines that decode are parts of one group, in
    order, and only the first may be its part 1; a whole group after the damage means
    the damage is in the middle of the log, which is never cut.
    """
    lines = data.split(b"\n")
    tail = lines.pop()
    offset = cut_offset = 0
    cut_line = 1  # the line (from 1) the cut starts at
    for index, line in enumerate(lines):
        try:
            _record, part = decode_line(line)
        except ValueError:
            break
        offset += len(line) + 1
        if part is None or part[0] == part[1]:
            cut_offset, cut_line = offset, index + 2
    if cut_offset == 0:
        raise RepairRefused(f"{path}:1", "the log holds no whole group; nothing would be left")
    remains: list[tuple[Record, tuple[int, int] | None] | None] = []
    readable = []
    for index in range(cut_line - 1, len(lines)):
        try:
            record, part = decode_line(lines[index])
        except ValueError:
            remains.append(None)
            readable.append(f"line {index + 1}: undecodable")
            continue
        remains.append((record, part))
        key = f" key={record.key}" if isinstance(record, User) and record.key else ""
        where = f" part {part[0]} of {part[1]}" if part else ""
        readable.append(f"line {index + 1}: {record.TYPE}{where}{key}")
    if tail:
        readable.append(f"line {len(lines) + 1}: unterminated ({len(tail)} bytes)")
    if tail:
        remains.append(None)
    _check_one_group(path, cut_line, remains)
    last_line = len(lines) + (1 if tail else 0)
    if last_line < cut_line:
        raise _not_a_torn_tail(torn)
    keys = tuple(r.key for r, _p in filter(None, remains) if isinstance(r, User) and r.key)
    return _Cut(cut_offset, cut_line, last_line, tuple(readable), keys)


def _check_one_group(
    path: str, cut_line: int, remains: list[tuple[Record, tuple[int, int] | None] | None]
) -> None:
    """Refuse unless the decodable lines after the cut are the parts of one group, in order.

    ``remains`` holds each line after the cut, None for a line that does not decode (the
    torn last line included). Only the very first line may be a part 1: a part 1 after
    damage starts a group the damage does not belong to; and nothing may follow the
    group's last part.
    """
    size = previous = 0
    for position, line in enumerate(remains):
        if previous and previous == size:
            raise RepairRefused(
                f"{path}:{cut_line}",
                "more follows the end of the damaged group: the damage is not confined to the "
                f"last group, and a log is never cut in the middle. {_NEVER_IN_PLACE}",
            )
        if line is None:
            continue
        record, part = line
        if part is None or isinstance(record, SessionStart | EpochEnd):
            raise RepairRefused(
                f"{path}:{cut_line}",
                f"a whole {record.TYPE} record follows the damage: the damage is not confined "
                f"to the last group, and a log is never cut in the middle. {_NEVER_IN_PLACE}",
            )
        place, parts = part
        if (place == 1 and position > 0) or (size and parts != size) or place <= previous:
            raise RepairRefused(
                f"{path}:{cut_line}",
                "the lines after the damage belong to more than one group: the damage is not "
                "confined to the last group, and a log is never cut in the middle. "
                f"{_NEVER_IN_PLACE}",
            )
        size, previous = parts, place


def _not_a_torn_tail(problem: LogError) -> RepairRefused:
    return RepairRefused(
        f"{problem.path}:{problem.line}",
        f"{problem.why}; repair only moves a damaged last group of the newest log, "
        f"and this is not one. {_NEVER_IN_PLACE}",
    )


def make_dirs(path: str) -> None:
    """Make ``path`` and its missing parents durably (each new name fsynced in its parent)."""
    missing = []
    current = path
    while not os.path.isdir(current):
        missing.append(current)
        current = os.path.dirname(current)
    for directory in reversed(missing):
        durable.mkdir(directory)
        durable.fsync_dir(os.path.dirname(directory))
