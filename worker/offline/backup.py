"""A consistent copy of a session, taken while it may be live: ``loopd backup``.

A session's files are append-only or written once: a sealed epoch's log and every
baseline never change, and the newest log only grows, a whole group at a time. So a
copy is consistent if it takes the sealed epochs as they are, the newest log up to a
group boundary, and the key index files the newest ``SessionStart`` names. The
boundary (the *point*) is named by the live worker, between two batches, when all it
wrote is fsynced (``durable_point``). For a session no worker runs, the newest log is
cut at its last whole group: the copy takes no lock, since a worker started meanwhile
(a hibernated session woken by a request) would find it held and go FATAL; a worker's
appends after the read are simply not in the copy.

A copy goes to ``<dest>/<id>.partial/`` (each file fsynced), its manifest (every file's
size and SHA-256) is written last, and the directory is renamed to ``<dest>/<id>`` and
fsynced: a backup directory with a manifest is whole. Key index files are replaced by a
merge at an epoch commit; a copy that finds a named one gone raises ``PointMoved`` and
is taken again from a newer point.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from worker.offline.repair import RepairRefused, find_cut, make_dirs
from worker.store.disk import durable
from worker.store.disk.files import open_directory, read_file
from worker.store.disk.layout import session_dir
from worker.store.errors import PathError, SessionError, SessionIOError, TornLog
from worker.store.format.records import SessionStart, decode_line
from worker.store.key_index import INDEX_SUFFIX, parse_field
from worker.store.loader import baseline_path, list_epochs, load_session, log_path
from worker.store.unfinished_salvage import refuse_unfinished_salvage

MANIFEST: Final = "loopd-backup.json"
FORMAT: Final = "loopd-backup 1"
PARTIAL: Final = ".partial"


class BackupError(PathError):
    """A backup cannot be taken, or a backup directory is not one; ``path: why``."""


class PointMoved(SessionError):
    """A file the point needs was replaced meanwhile (an epoch commit): take a newer point."""


@dataclass(frozen=True, slots=True)
class Point:
    """Where the copy of the newest log ends: epoch, bytes, and who named it."""

    epoch: int
    size: int
    named_by: str  # "worker" or "last whole group"


@dataclass(frozen=True, slots=True)
class BackupResult:
    directory: str
    point: Point
    files: int
    size: int
    refused: str | None  # what the loader says of the copy, if it refuses it
    left: int  # bytes of the newest log after its last whole group, not copied


def last_group_end(data: bytes) -> int:
    """The length of the longest prefix of ``data`` made of whole, decodable groups."""
    offset = end = 0
    for line in data.split(b"\n")[:-1]:
        try:
            _record, part = decode_line(line)
        except ValueError:
            break
        offset += len(line) + 1
        if part is None or part[0] == part[1]:
            end = offset
    return end


def _only_a_torn_tail(path: str, data: bytes, end: int) -> None:
    """Refuse to cut the newest log at ``end`` unless what follows is one damaged last
    group, as a crash leaves it (the rule ``loopd repair`` cuts by): damage with whole
    groups after it may hide acknowledged records, and a copy without them would
    verify as if they had never been written."""
    line = data.count(b"\n", 0, end) + 1
    try:
        find_cut(path, data, TornLog(path, line, "damaged after the last whole group"))
    except RepairRefused as exc:
        raise BackupError(
            path,
            f"damaged at line {line}, and more than a torn last group follows ({exc.why}): "
            "no worker names a point to cut at, and a copy cut there could lack acknowledged "
            "records. Nothing was copied; `loopd salvage` keeps the intact prefix, or "
            "restore an older backup",
        ) from exc


def backup_session(
    home: str | os.PathLike[str],
    session_id: str,
    dest: str,
    point: Point | None,
    app: str | None = None,
    tenant: str | None = None,
) -> BackupResult:
    """Copy the session to ``<dest>/<id>``, up to ``point`` (None: no worker runs it, and
    the newest log is cut at its last whole group). ``app``: the named App the session
    was created with; ``tenant``: the tenant it belongs to (None: the operator); both
    kept in the manifest for its restore, with the home's real path (the tenant is given
    back by a restore into that home)."""
    directory = session_dir(home, session_id)
    target = os.path.join(dest, session_id)
    if os.path.lexists(target):
        # A rerun after a backup cut short between its rename and the directory's fsync
        # finds it there: its name is made durable before the refusal says it exists.
        finish_backup(target)
        raise BackupError(target, "already exists; back up to a new directory")
    fd = open_directory(directory)
    try:
        chosen, contents, left = _collect(directory, fd, point)
    finally:
        os.close(fd)
    owner = None if tenant is None else (tenant, os.path.realpath(home))
    return _write(target, session_id, chosen, contents, left, app, owner)


def _collect(directory: str, fd: int, point: Point | None) -> tuple[Point, dict[str, bytes], int]:
    """Read what the copy holds: {file name: bytes}, the point it ends at, and how many
    bytes of the newest log follow the point when no worker named it (0 if it did)."""
    refuse_unfinished_salvage(directory, fd)  # a half-cut session is no point in time
    epochs = list_epochs(directory, fd)
    left = 0
    if point is None:
        newest = epochs[-1]
        data = _read(fd, directory, f"{newest}.jsonl")
        point = Point(newest, last_group_end(data), "last whole group")
        left = len(data) - point.size
        if left:
            _only_a_torn_tail(log_path(directory, newest), data, point.size)
    if point.epoch not in epochs:
        raise BackupError(log_path(directory, point.epoch), "the point's log is missing")
    newest_name = f"{point.epoch}.jsonl"
    newest_data = _read(fd, directory, newest_name)[: point.size]
    if len(newest_data) != point.size:
        raise BackupError(
            log_path(directory, point.epoch),
            f"is shorter ({len(newest_data)} bytes) than the point ({point.size} bytes)",
        )
    contents: dict[str, bytes] = {}
    # The index files first: they are what an epoch commit may replace meanwhile.
    for name in index_names(log_path(directory, point.epoch), newest_data, point.epoch):
        try:
            contents[name] = read_file(fd, name, os.path.join(directory, name))
        except SessionIOError as exc:
            raise PointMoved(f"{name} was replaced by an epoch commit") from exc
    for epoch in range(point.epoch):
        contents[f"{epoch}.jsonl"] = _read(fd, directory, f"{epoch}.jsonl")
    for epoch in range(point.epoch + 1):
        name = os.path.basename(baseline_path(directory, epoch))
        try:
            contents[name] = _read(fd, directory, name)
        except SessionIOError as exc:
            # A sealed epoch's baseline is not read by open (nor by verify): copied if
            # there. The newest epoch's is needed, and its absence raised.
            if exc.errno != errno.ENOENT or epoch == point.epoch:
                raise
    contents[newest_name] = newest_data
    return point, contents, left


def index_names(path: str, data: bytes, epoch: int) -> list[str]:
    first = data.split(b"\n", 1)[0]
    try:
        record, _part = decode_line(first)
    except ValueError:
        return []  # the copy's check says what is wrong with it
    if not isinstance(record, SessionStart) or not record.key_index:
        return []
    return [f"{a}-{b}{INDEX_SUFFIX}" for a, b, _d in parse_field(path, epoch, record.key_index)]


def _read(fd: int, directory: str, name: str) -> bytes:
    return read_file(fd, name, os.path.join(directory, name))


def write_backup(
    dest: str, session_id: str, point: Point, contents: dict[str, bytes]
) -> BackupResult:
    """Write ``contents`` (a session's files up to ``point``) as the backup ``<dest>/<id>``."""
    target = os.path.join(dest, session_id)
    if os.path.lexists(target):
        raise BackupError(target, "already exists; back up to a new directory")
    return _write(target, session_id, point, contents, 0, None, None)


def _write(
    target: str,
    session_id: str,
    point: Point,
    contents: dict[str, bytes],
    left: int,
    app: str | None,
    owner: tuple[str, str] | None,
) -> BackupResult:
    partial = target + PARTIAL
    if os.path.lexists(partial):
        raise BackupError(partial, "is left from a backup cut short; move it aside first")
    make_dirs(partial)
    files = []
    for name, data in sorted(contents.items()):
        durable.write_file_atomic(os.path.join(partial, name), data, sync_dir=False)
        files.append({"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    manifest = {
        "format": FORMAT,
        "session": session_id,
        "taken": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "point": {"epoch": point.epoch, "bytes": point.size, "named_by": point.named_by},
        "files": files,
    }
    if app is not None:
        manifest["app"] = app
    if owner is not None:  # absent from a backup of the operator's or of before tenants
        manifest["tenant"], manifest["home"] = owner
    text = json.dumps(manifest, indent=1, sort_keys=True).encode() + b"\n"
    durable.write_file_atomic(os.path.join(partial, MANIFEST), text)
    durable.rename(partial, target)
    finish_backup(target)
    refused = None
    try:
        load_session(target, session_id, history=True)
    except SessionError as exc:
        refused = str(exc)
    size = sum(len(d) for d in contents.values())
    return BackupResult(target, point, len(files), size, refused, left)


def finish_backup(target: str) -> None:
    """Make a backup directory's name durable: the last step of a backup, which a crash
    can cut off after the rename; a rerun that finds the backup there does it.

    The destination's own name is fsynced in its parent too: a backup cut short after it
    made the destination leaves one that the rerun finds and never makes again.
    """
    dest = os.path.dirname(os.path.abspath(target))
    durable.fsync_dir(dest)
    durable.fsync_dir(os.path.dirname(dest))
