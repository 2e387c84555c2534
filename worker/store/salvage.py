"""Salvage, for damage ``repair`` refuses: keep the longest prefix open accepts.

Explicit and loud: the operator asks for it by name, and what it cuts may hold
acknowledged work. The loader is the judge: each time it refuses the session at
``path:line``, the log at ``path`` is cut back to its last whole group before that
line (all of it, if nothing is left before), every later epoch is cut away whole, and
the loader is asked again, of a candidate built beside the session (hard links of the
files kept, the one cut log written), until it accepts one. Nothing changes until it
does. Then everything cut is moved, byte for byte, into
``<home>/quarantine/<id>/<time>-salvage/`` (never deleted), the cut log truncated, and
the session must open.

Damage the loader does not report at a log line (a missing or damaged baseline, a
key index file) is not salvaged: ``repair`` handles those it can.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from typing import Final

from worker.store import durable
from worker.store.backup import index_names, last_group_end
from worker.store.errors import KeyIndexFileError, LogError, PathError, SessionError, SessionLocked
from worker.store.files import read_file
from worker.store.key_index import write_segments
from worker.store.layout import lock_existing, session_dir
from worker.store.loader import list_epochs, load_session
from worker.store.lock import unlock_directory
from worker.store.records import User, decode_line
from worker.store.repair import QUARANTINE_DIR, make_dirs
from worker.store.trash import TRASH_DIR, stamp

_LOG: Final = re.compile(r"(0|[1-9][0-9]*)\.jsonl")
_OWN_FILE: Final = re.compile(r"[0-9]+(\.jsonl|\.baseline\.json|-[0-9]+\.keys)")


class SalvageRefused(PathError):
    """Salvage will not touch this session; ``why`` says what to do instead."""


@dataclass(frozen=True, slots=True)
class Cut:
    """What was cut from one log: its epoch, the lines, the records' types and keys."""

    epoch: int
    first_line: int  # the first line cut (from 1)
    last_line: int
    whole: bool  # the whole epoch went (its log and baseline)
    records: tuple[str, ...]  # "line 9: User key=k3", "line 12: undecodable"
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SalvageResult:
    refusal: str  # what the loader said first
    kept_epoch: int
    kept_bytes: int
    cuts: tuple[Cut, ...]
    quarantine: str


def salvage_session(home: str | os.PathLike[str], session_id: str) -> SalvageResult:
    """Keep the longest prefix of the session that open accepts; quarantine the rest."""
    home = os.fspath(home)
    directory = session_dir(home, session_id)
    try:
        lock_fd = lock_existing(directory)
    except SessionLocked as exc:
        raise SalvageRefused(
            directory, f"the session is held by a worker; stop it first (loopd stop {session_id})"
        ) from exc
    try:
        return _salvage_locked(home, directory, session_id, lock_fd)
    finally:
        unlock_directory(lock_fd)


def _refusal(directory: str, session_id: str, *, index_files: bool = True) -> LogError | None:
    """The loader's refusal of the session in ``directory`` at a log line, if any. A
    candidate is read without its key index files (rebuilt from its logs), since a cut
    back to an older epoch needs the index files a later commit merged away."""
    try:
        load_session(directory, session_id, history=True, index_files=index_files)
    except KeyIndexFileError as exc:
        raise SalvageRefused(
            f"{exc.path}:{exc.line}", f"{exc.why}; `loopd repair` rebuilds the key index"
        ) from exc
    except LogError as exc:
        return exc
    except SessionError as exc:
        raise SalvageRefused(
            directory, f"{exc}; salvage only cuts logs (see `loopd repair --rebuild-baseline`)"
        ) from exc
    return None


def _salvage_locked(home: str, directory: str, session_id: str, dir_fd: int) -> SalvageResult:
    first = _refusal(directory, session_id)
    if first is None:
        raise SalvageRefused(directory, "the session opens cleanly: nothing to salvage")
    epochs = list_epochs(directory, dir_fd)
    names = {e: f"{e}.jsonl" for e in epochs}
    logs = {e: read_file(dir_fd, n, os.path.join(directory, n)) for e, n in names.items()}
    problem: LogError | None = first
    keep_epoch, keep_bytes = epochs[-1], len(logs[epochs[-1]])
    scratch = os.path.join(home, TRASH_DIR, f".salvage-{session_id}.{stamp()}")
    try:
        while problem is not None:
            keep_epoch, keep_bytes = _cut_before(directory, problem, keep_epoch, keep_bytes, logs)
            _build(scratch, directory, keep_epoch, logs[keep_epoch][:keep_bytes])
            problem = _refusal(scratch, session_id, index_files=False)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # hard links and one written prefix
    cuts = _describe_cuts(logs, keep_epoch, keep_bytes)
    target = os.path.join(home, QUARANTINE_DIR, session_id, f"{stamp()}-salvage")
    make_dirs(target)
    kept_names = set(_kept_names(directory, keep_epoch, logs[keep_epoch][:keep_bytes]))
    for name in sorted(os.listdir(dir_fd)):
        if _is_store_file(name) and name not in kept_names:
            durable.rename(os.path.join(directory, name), os.path.join(target, name))
    tail = logs[keep_epoch][keep_bytes:]
    if tail:
        durable.write_file_atomic(os.path.join(target, f"{keep_epoch}.jsonl.cut"), tail)
        path = os.path.join(directory, f"{keep_epoch}.jsonl")
        fd = durable.open_append(path)
        try:
            durable.truncate(fd, keep_bytes, path)
        finally:
            durable.close(fd)
    durable.fsync_dir(target)
    # The index files the kept newest epoch names, rebuilt from the logs (derived data).
    state = load_session(directory, session_id, dir_fd=dir_fd, history=True, index_files=False)
    write_segments(directory, state.key_index.segments)
    durable.fsync_dir(directory)
    load_session(directory, session_id, dir_fd=dir_fd, history=True)  # it must open now
    return SalvageResult(str(first), keep_epoch, keep_bytes, cuts, target)


def _cut_before(
    directory: str, problem: LogError, epoch: int, size: int, logs: dict[int, bytes]
) -> tuple[int, int]:
    """The prefix (epoch, bytes of its log) that ends before ``problem``'s line."""
    match = _LOG.fullmatch(os.path.basename(problem.path))
    if match is None:
        raise SalvageRefused(
            f"{problem.path}:{problem.line}", f"{problem.why}; this is not a log salvage can cut"
        )
    bad = int(match[1])
    bad = min(bad, epoch)  # the candidate holds no later epoch
    data = logs[bad][: size if bad == epoch else None]
    lines = data.split(b"\n")
    before = b"\n".join(lines[: max(problem.line - 1, 0)])
    cut = last_group_end(before + b"\n") if before else 0
    if cut > 0:
        return bad, cut
    if bad == 0:
        raise SalvageRefused(
            f"{problem.path}:{problem.line}",
            f"{problem.why}; no whole group comes before it: nothing would be left. "
            "Restore the session from a backup",
        )
    return bad - 1, len(logs[bad - 1])


def _kept_names(directory: str, epoch: int, newest: bytes) -> list[str]:
    """The files of the prefix: its logs and baselines, the index files its newest names."""
    names = [f"{e}{suffix}" for e in range(epoch + 1) for suffix in (".jsonl", ".baseline.json")]
    return names + index_names(os.path.join(directory, f"{epoch}.jsonl"), newest, epoch)


def _is_store_file(name: str) -> bool:
    return _OWN_FILE.fullmatch(name) is not None


def _build(scratch: str, directory: str, epoch: int, newest: bytes) -> None:
    """The candidate: the files kept, hard-linked (copied across filesystems), and the cut log."""
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    for name in _kept_names(directory, epoch, newest):
        source = os.path.join(directory, name)
        if name == f"{epoch}.jsonl" or not os.path.exists(source):
            continue
        try:
            os.link(source, os.path.join(scratch, name))
        except OSError:
            shutil.copyfile(source, os.path.join(scratch, name))
    with open(os.path.join(scratch, f"{epoch}.jsonl"), "wb") as f:
        f.write(newest)


def _describe_cuts(logs: dict[int, bytes], epoch: int, size: int) -> tuple[Cut, ...]:
    cuts = []
    for e in sorted(logs):
        if e < epoch:
            continue
        data = logs[e][size:] if e == epoch else logs[e]
        if not data:
            continue
        start = logs[e][:size].count(b"\n") + 1 if e == epoch else 1
        cuts.append(_describe(e, start, data, whole=e > epoch))
    return tuple(cuts)


def _describe(epoch: int, start: int, data: bytes, *, whole: bool) -> Cut:
    records, keys = [], []
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for number, line in enumerate(lines, start=start):
        try:
            record, _part = decode_line(line)
        except ValueError:
            records.append(f"line {number}: undecodable ({len(line)} bytes; any key in it unknown)")
            continue
        key = record.key if isinstance(record, User) else None
        if key is not None:
            keys.append(key)
        records.append(f"line {number}: {record.TYPE}" + (f" key={key}" if key else ""))
    return Cut(epoch, start, start + len(lines) - 1, whole, tuple(records), tuple(keys))
