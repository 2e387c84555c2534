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

Crash-safe as the store is: before its first rename salvage writes its plan (what it
moves, where the kept log ends, every line and key it cuts) durably into the session
directory (worker.offline.salvage_plan). A salvage killed at any step, with or without a
power loss, is finished by the next ``loopd salvage``, which does each step again
whether or not it happened and reports everything the plan cut; until then open and
verify refuse the session, pointing here.

Damage the loader does not report at a log line (a missing or damaged baseline, a
key index file) is not salvaged: ``repair`` handles those it can.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from typing import Final

from worker.offline.backup import index_names, last_group_end
from worker.offline.repair import QUARANTINE_DIR, make_dirs
from worker.offline.salvage_plan import PLAN_NAME, Cut, SalvagePlan, plan_present
from worker.offline.trash import TRASH_DIR, stamp
from worker.store.disk import durable
from worker.store.disk.files import read_file
from worker.store.disk.layout import lock_existing, session_dir
from worker.store.disk.lock import unlock_directory
from worker.store.errors import (
    KeyIndexFileError,
    LogError,
    PathError,
    SessionError,
    SessionIOError,
    SessionLocked,
)
from worker.store.format.records import User, decode_line
from worker.store.key_index import write_segments
from worker.store.loader import list_epochs, load_session

__all__ = ["Cut", "SalvageRefused", "SalvageResult", "salvage_session"]

_LOG: Final = re.compile(r"(0|[1-9][0-9]*)\.jsonl")
_OWN_FILE: Final = re.compile(r"[0-9]+(\.jsonl|\.baseline\.json|-[0-9]+\.keys)")
_ABSENT: Final = frozenset({errno.ENOENT, errno.ENOTDIR})


class SalvageRefused(PathError):
    """Salvage will not touch this session; ``why`` says what to do instead."""


@dataclass(frozen=True, slots=True)
class SalvageResult:
    refusal: str  # what the loader said first
    kept_epoch: int
    kept_bytes: int
    cuts: tuple[Cut, ...]
    quarantine: str
    resumed: bool = False  # an interrupted salvage's plan was finished, not a new one made


def salvage_session(home: str | os.PathLike[str], session_id: str) -> SalvageResult:
    """Keep the longest prefix of the session that open accepts; quarantine the rest.

    Finishes an interrupted salvage instead, if one left its plan.
    """
    home = os.fspath(home)
    directory = session_dir(home, session_id)
    try:
        lock_fd = lock_existing(directory)
    except SessionLocked as exc:
        raise SalvageRefused(
            directory, f"the session is held by a worker; stop it first (loopd stop {session_id})"
        ) from exc
    try:
        if plan_present(directory, lock_fd):
            path = os.path.join(directory, PLAN_NAME)
            plan = SalvagePlan.from_json(path, read_file(lock_fd, PLAN_NAME, path))
            return _finish(home, directory, lock_fd, plan, resumed=True)
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
        # A rerun of a salvage that finished all but making its last steps durable (a
        # failed fsync, a crash) makes them durable before it says there is nothing to do.
        _sync_quarantine(home, session_id, every=True)
        durable.fsync_dir(directory)
        raise SalvageRefused(
            directory,
            "the session opens cleanly: nothing to salvage" + _last_salvage(home, session_id),
        )
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
    kept_names = set(_kept_names(directory, keep_epoch, logs[keep_epoch][:keep_bytes]))
    moves = [n for n in os.listdir(dir_fd) if _is_store_file(n) and n not in kept_names]
    tail = logs[keep_epoch][keep_bytes:]
    plan = SalvagePlan(
        session=session_id,
        refusal=str(first),
        target=f"{stamp()}-salvage",
        keep_epoch=keep_epoch,
        keep_bytes=keep_bytes,
        # The newest epoch's files first: a salvage cut short without its plan (the
        # plan is the guard; this only keeps what is left readable) leaves no gap.
        moves=tuple(sorted(moves, key=_epoch_first, reverse=True)),
        tail_sha256=hashlib.sha256(tail).hexdigest() if tail else None,
        cuts=_describe_cuts(logs, keep_epoch, keep_bytes),
    )
    # The quarantine directory is durable before the plan names it; the plan is durable
    # before the first rename (write, fsync, rename, fsync of the session directory).
    make_dirs(os.path.join(home, QUARANTINE_DIR, session_id, plan.target))
    durable.write_file_atomic(os.path.join(directory, PLAN_NAME), plan.to_json())
    return _finish(home, directory, dir_fd, plan, resumed=False)


def _finish(
    home: str, directory: str, dir_fd: int, plan: SalvagePlan, *, resumed: bool
) -> SalvageResult:
    """Do every step of ``plan``, each whether or not an interrupted run did it; then
    move the plan beside what it cut. The session must open afterwards."""
    target = os.path.join(home, QUARANTINE_DIR, plan.session, plan.target)
    make_dirs(target)
    _sync_quarantine(home, plan.session)
    for name in plan.moves:
        source = os.path.join(directory, name)
        # After a power loss a moved file may show under both names (the quarantine's
        # entry made durable, the session directory's removal not): same bytes, and
        # the rename over the quarantine's copy leaves one.
        if os.path.lexists(source):
            durable.rename(source, os.path.join(target, name))
    log_name = f"{plan.keep_epoch}.jsonl"
    log = os.path.join(directory, log_name)
    data = read_file(dir_fd, log_name, log)
    if len(data) < plan.keep_bytes:
        raise SalvageRefused(
            log, f"is {len(data)} bytes, shorter than the {plan.keep_bytes} the salvage keeps "
            f"({os.path.join(directory, PLAN_NAME)}): it changed since the plan was made",
        )  # fmt: skip
    tail = data[plan.keep_bytes :]
    if tail:
        if hashlib.sha256(tail).hexdigest() != plan.tail_sha256:
            raise SalvageRefused(
                log, f"its bytes after byte {plan.keep_bytes} are not the ones the salvage "
                f"cuts ({os.path.join(directory, PLAN_NAME)}): it changed since the plan",
            )  # fmt: skip
        # The cut lines are durable in quarantine before the log loses them.
        durable.write_file_atomic(os.path.join(target, f"{log_name}.cut"), tail)
    # The quarantine's new names first: a name made durable only in the session
    # directory's removal would be lost to a power loss.
    durable.fsync_dir(target)
    durable.fsync_dir(directory)
    if tail:
        fd = durable.open_append(log)
        try:
            durable.truncate(fd, plan.keep_bytes, log)
        finally:
            durable.close(fd)
    _rebuild_index(home, directory, plan, data[: plan.keep_bytes])
    durable.fsync_dir(directory)
    durable.rename(os.path.join(directory, PLAN_NAME), os.path.join(target, PLAN_NAME))
    durable.fsync_dir(target)
    durable.fsync_dir(directory)
    load_session(directory, plan.session, dir_fd=dir_fd, history=True)  # it must open now
    return SalvageResult(plan.refusal, plan.keep_epoch, plan.keep_bytes, plan.cuts, target, resumed)


def _rebuild_index(home: str, directory: str, plan: SalvagePlan, newest: bytes) -> None:
    """Write the index files the kept newest epoch names, rebuilt from the kept logs
    (derived data), read from a candidate beside the session (the plan is still in it)."""
    scratch = os.path.join(home, TRASH_DIR, f".salvage-{plan.session}.{stamp()}")
    try:
        _build(scratch, directory, plan.keep_epoch, newest)
        state = load_session(scratch, plan.session, history=True, index_files=False)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    write_segments(directory, state.key_index.segments)


def _sync_quarantine(home: str, session_id: str, *, every: bool = False) -> None:
    """fsync every name on the way to the session's quarantine (and, with ``every``, its
    salvages' directories): a run cut short after it made ``quarantine/`` and before
    its parent's fsync leaves a directory the rerun finds and never makes again, and a
    power loss could take it away with all that was moved into it."""
    root = os.path.join(home, QUARANTINE_DIR)
    mine = os.path.join(root, session_id)
    if not os.path.isdir(mine):
        return
    durable.fsync_dir(home)
    durable.fsync_dir(root)
    durable.fsync_dir(mine)
    for name in sorted(os.listdir(mine)) if every else ():
        if name.endswith("-salvage") and os.path.isdir(os.path.join(mine, name)):
            durable.fsync_dir(os.path.join(mine, name))


def _last_salvage(home: str, session_id: str) -> str:
    """What the session's last salvage cut (from its plan in quarantine), for a rerun of
    one that finished all but its report; empty if there is none."""
    root = os.path.join(home, QUARANTINE_DIR, session_id)
    try:
        names = sorted(n for n in os.listdir(root) if n.endswith("-salvage"))
    except OSError as exc:
        if exc.errno in _ABSENT:
            return ""
        raise
    for name in reversed(names):
        path = os.path.join(root, name, PLAN_NAME)
        try:
            with open(path, "rb") as f:
                plan = SalvagePlan.from_json(path, f.read())
        except OSError as exc:
            if exc.errno in _ABSENT:
                continue
            raise
        keys = ", ".join(plan.keys) if plan.keys else "none"
        return (
            f"; the last salvage moved what it cut to {os.path.join(root, name)} "
            f"(keys cut ({len(plan.keys)}): {keys}; its {PLAN_NAME} lists every line)"
        )
    return ""


def _epoch_first(name: str) -> tuple[int, str]:
    return int(re.split(r"[.-]", name, maxsplit=1)[0]), name


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
    """The candidate: the files kept, hard-linked (copied across filesystems), and the cut log.

    A failure to write it (a full disk, a quota) is the store's SessionIOError, naming
    the candidate: nothing of the session has changed when it is built.
    """
    shutil.rmtree(scratch, ignore_errors=True)
    try:
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
    except OSError as exc:
        raise SessionIOError(scratch, exc.errno or 0, "building salvage's candidate") from exc


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
    return Cut(
        epoch=epoch,
        first_line=start,
        last_line=start + len(lines) - 1,
        whole=whole,
        records=tuple(records),
        keys=tuple(keys),
    )
