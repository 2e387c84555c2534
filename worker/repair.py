"""Explicit repair, only on an operator's request: move an unterminated last line out.

A crash mid-write can leave the newest log's last line without its newline. Nothing in
that line was acknowledged (acknowledgement follows the fsync of a whole line), so it
can be moved, byte for byte, into ``<home>/quarantine/<id>/`` and the log cut back to
its last whole line. Anything else, above all a bad line in the middle of a log, is
refused: that is damage to acknowledged data and needs a human and a backup.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from worker import durable
from worker.errors import LogError, PathError, SessionLocked, TornLog
from worker.layout import session_dir
from worker.loader import check_epoch, decode_log, list_epochs, load_session, log_path, read_file
from worker.lock import lock_directory, unlock_directory

QUARANTINE_DIR: Final = "quarantine"


class RepairRefused(PathError):
    """Repair will not touch this session; ``why`` says what to do instead."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RepairResult:
    """What repair moved: from which log and line, how many bytes, to which file."""

    log: str
    line: int
    moved_bytes: int
    quarantine: str
    kept_bytes: int


def repair_torn_tail(home: str | os.PathLike[str], session_id: str) -> RepairResult:
    """Move the newest log's unterminated last line into quarantine; refuse anything else."""
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
        return _repair_locked(os.fspath(home), directory, session_id)
    finally:
        unlock_directory(lock_fd)


def _repair_locked(home: str, directory: str, session_id: str) -> RepairResult:
    try:
        load_session(directory, session_id)
    except TornLog as exc:
        torn = exc
    else:
        raise RepairRefused(directory, "the session opens cleanly: nothing to repair")
    epochs = list_epochs(directory)
    newest = log_path(directory, epochs[-1])
    data = read_file(newest)
    whole = data.count(b"\n")
    if torn.path != newest or data.endswith(b"\n") or torn.line != whole + 1:
        raise _not_a_torn_tail(torn)
    keep = data[: data.rfind(b"\n") + 1]
    if not keep:
        raise RepairRefused(f"{newest}:1", "the log holds no whole line; nothing would be left")
    # Check the log that would remain before changing anything.
    try:
        records = decode_log(newest, keep)
        check_epoch(newest, session_id, epochs[-1], records, newest=True)
    except LogError as exc:
        raise _not_a_torn_tail(exc) from exc
    tail = data[len(keep) :]
    target_dir = os.path.join(home, QUARANTINE_DIR, session_id)
    _make_dirs(target_dir)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    target = os.path.join(target_dir, f"{stamp}-{epochs[-1]}.jsonl.torn")
    durable.write_file_atomic(target, tail)
    fd = durable.open_append(newest)
    try:
        durable.truncate(fd, len(keep), newest)
    finally:
        durable.close(fd)
    load_session(directory, session_id)  # the repaired session must open
    return RepairResult(
        log=newest, line=torn.line, moved_bytes=len(tail), quarantine=target, kept_bytes=len(keep)
    )


def _not_a_torn_tail(problem: LogError) -> RepairRefused:
    return RepairRefused(
        f"{problem.path}:{problem.line}",
        f"{problem.why}; repair only moves an unterminated last line of the newest log, "
        "and this is not one. It is never repaired in place: restore the session from "
        "a backup, or move it aside with its files intact",
    )


def _make_dirs(path: str) -> None:
    """Make ``path`` and its missing parents durably (each new name fsynced in its parent)."""
    missing = []
    current = path
    while not os.path.isdir(current):
        missing.append(current)
        current = os.path.dirname(current)
    for directory in reversed(missing):
        durable.mkdir(directory)
        durable.fsync_dir(os.path.dirname(directory))
