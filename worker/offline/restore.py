"""Putting a backup back: ``loopd restore`` (the copy ``worker.offline.backup`` made).

The manifest is checked first, every file of it (its size and SHA-256, a regular file,
nothing unlisted beside it); only then is anything written. A session that is there is
never overwritten: with ``replace`` (``--force``) its directory is moved to
``<home>/trash/`` first, under its lock (so never while a worker holds it). The files
are written to ``<home>/trash/<id>.<time>.restoring/``, fsynced, and the directory
renamed into ``sessions/`` in one step; a restore cut short leaves its remains in the
trash, never a half session.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final

from worker.offline.backup import FORMAT, MANIFEST, BackupError
from worker.offline.repair import make_dirs
from worker.offline.restore_drops import NOTHING, Drop, DropNotConfirmed, work_dropped
from worker.offline.trash import TRASH_DIR, move_to_trash, stamp
from worker.store.disk import durable
from worker.store.disk.files import open_directory, read_file
from worker.store.disk.layout import SESSIONS_DIR, session_dir
from worker.store.errors import SessionError
from worker.store.loader import load_session

_NAME: Final = re.compile(r"[0-9]+(\.jsonl|\.baseline\.json|-[0-9]+\.keys)")
_DIGEST: Final = re.compile(r"[0-9a-f]{64}")
# A database session's scan summary (docs/format.md, "The scan summary"), which a backup
# taken by a loopd from before it was kept there listed as one of its files: checked as
# they are, never restored (a cache, no part of the session).
_CACHE: Final = "loopd.scan"
MAX_MANIFEST: Final = 64 << 20


@dataclass(frozen=True, slots=True)
class Manifest:
    session: str
    taken: str
    files: dict[str, bytes]  # checked against their sizes and digests
    app: str | None  # the named App the session was created with, if any
    tenant: str | None = None  # its tenant when it was taken (None: the operator's)
    home: str | None = None  # the real path of the home it was taken from, with a tenant


@dataclass(frozen=True, slots=True)
class RestoreResult:
    directory: str
    manifest: Manifest
    replaced: str | None  # where the session that was there went
    dropped: Drop = NOTHING  # its work that the backup does not hold


def check_backup(source: str) -> Manifest:
    """Read and check a backup directory; BackupError naming the first problem."""
    fd = open_directory(source)
    try:
        where = os.path.join(source, MANIFEST)
        try:
            raw = read_file(fd, MANIFEST, where)
        except SessionError as exc:
            raise BackupError(where, f"not a loopd backup: {exc}") from exc
        if len(raw) > MAX_MANIFEST:
            raise BackupError(where, "is too large to be a manifest")
        try:
            document = json.loads(raw)
        except ValueError as exc:
            raise BackupError(where, f"is not JSON: {exc}") from exc
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise BackupError(where, f"is not a manifest of the format {FORMAT!r}")
        session, taken, listed = (document.get(k) for k in ("session", "taken", "files"))
        if (
            not isinstance(session, str)
            or not isinstance(taken, str)
            or not isinstance(listed, list)
        ):
            raise BackupError(where, "needs a session, a time taken and a list of files")
        files = {}
        cached = set()
        for entry in listed:
            name, size, digest = _entry(where, entry)
            data = read_file(fd, name, os.path.join(source, name))
            if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
                raise BackupError(
                    os.path.join(source, name),
                    f"does not match the manifest ({len(data)} bytes, the manifest says {size}; "
                    "or its SHA-256 differs): the backup is damaged",
                )
            if name == _CACHE:
                cached.add(name)
                continue
            files[name] = data
        extra = sorted(set(os.listdir(fd)) - set(files) - cached - {MANIFEST})
        if extra:
            raise BackupError(os.path.join(source, extra[0]), "is not in the manifest")
        app = document.get("app")
        if app is not None and not isinstance(app, str):
            raise BackupError(where, f"its app must be an App's name, not {app!r:.80}")
        tenant, home = document.get("tenant"), document.get("home")
        if (
            (tenant is None) != (home is None)
            or not isinstance(tenant, str | None)
            or (not isinstance(home, str | None))
        ):
            raise BackupError(where, "its tenant and home must be two strings, or absent")
        return Manifest(session, taken, files, app, tenant, home)
    finally:
        os.close(fd)


def _entry(where: str, entry: object) -> tuple[str, int, str]:
    if isinstance(entry, dict):
        name, size, digest = entry.get("name"), entry.get("bytes"), entry.get("sha256")
        if (
            isinstance(name, str)
            and (_NAME.fullmatch(name) or name == _CACHE)
            and type(size) is int
            and isinstance(digest, str)
            and _DIGEST.fullmatch(digest)
        ):
            return name, size, digest
    raise BackupError(where, f"a file entry is not {{name, bytes, sha256}}: {entry!r:.120}")


def restored_id(manifest: Manifest, session_id: str | None, source: str) -> str:
    """The id the backup at ``source`` is restored under: its own (``session_id``, if
    given, must be it); BackupError otherwise."""
    wanted = manifest.session if session_id is None else session_id
    if wanted != manifest.session:
        raise BackupError(
            source,
            f"is a backup of session {manifest.session!r}, not {wanted!r} (its id is in every "
            "SessionStart: a backup is restored under its own id)",
        )
    return wanted


def restore_session(
    home: str | os.PathLike[str],
    source: str,
    session_id: str | None,
    *,
    replace: bool,
    dropping: str = "",
) -> RestoreResult:
    """Check the backup at ``source`` and put it back as ``<home>/sessions/<id>``.

    A session that is there is replaced only with ``replace``, and only if the work of
    it the backup does not hold, read under its lock, is none or the set whose token is
    ``dropping`` (DropNotConfirmed otherwise, and nothing is replaced).
    """
    manifest = check_backup(source)
    wanted = restored_id(manifest, session_id, source)
    home = os.fspath(home)
    with _one_restore_at_a_time(home):
        directory = session_dir(home, wanted)
        if os.path.lexists(directory) and not replace:
            # A rerun after a restore cut short between its rename and the directory's fsync
            # finds it there: its name is made durable before the refusal says it exists.
            finish_restore(home, wanted)
            raise BackupError(
                directory, "already exists; --force moves it to the trash first, then restores"
            )
        staging = os.path.join(home, TRASH_DIR, f"{wanted}.{stamp()}.restoring")
        make_dirs(staging)
        for name, data in sorted(manifest.files.items()):
            durable.write_file_atomic(os.path.join(staging, name), data, sync_dir=False)
        durable.fsync_dir(staging)
        try:  # checked where it is staged: a copy that does not open replaces nothing
            load_session(staging, wanted, history=True)
        except SessionError as exc:
            kept = staging[: -len(".restoring")] + ".refused"
            durable.rename(staging, kept)
            why = str(exc).replace(staging, kept)  # its place where the operator finds it now
            raise BackupError(
                source, f"does not open as a session ({why}); nothing was replaced (the copy is "
                f"kept in {kept})",
            ) from exc  # fmt: skip
        replaced, dropped = None, NOTHING

        def confirmed(locked: str) -> None:
            nonlocal dropped
            dropped = work_dropped(locked, manifest.files)
            if dropped.records and dropped.token != dropping:
                raise DropNotConfirmed(locked, dropped)

        if os.path.lexists(directory) and not replace:  # a create meanwhile: never replaced
            shutil.rmtree(staging)
            raise BackupError(directory, "was made while this restore ran; nothing was replaced")
        if os.path.lexists(directory):
            try:  # refused while a worker holds it, or for work the operator did not confirm
                replaced = move_to_trash(home, wanted, confirmed)
            except SessionError:
                shutil.rmtree(staging)  # a copy of the backup, which is still whole at source
                raise
        make_dirs(os.path.join(home, SESSIONS_DIR))
        durable.rename(staging, directory)
        durable.fsync_dir(os.path.dirname(staging))
        finish_restore(home, wanted)
        return RestoreResult(directory, manifest, replaced, dropped)


@contextmanager
def _one_restore_at_a_time(home: str) -> Iterator[None]:
    """An exclusive flock on ``<home>/sessions`` while a restore checks that its session is
    not there and puts it there: a second restore of the same session at once waits, then
    finds it (two restores without --force once both succeeded, the second replacing the
    first's). Released with its descriptor, so a restore killed holds nothing; nothing
    else locks that directory (serve locks the home, a worker its session's).
    """
    sessions = os.path.join(home, SESSIONS_DIR)
    make_dirs(sessions)
    fd = os.open(sessions, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def finish_restore(home: str | os.PathLike[str], session_id: str) -> None:
    """Make a restored session's name durable: the last step of a restore, which a crash
    can cut off after the rename; an operator's rerun, which finds it there, does it.

    Every name on the way is fsynced, ``sessions/`` in the home as well as the session in
    ``sessions/``, as ``Session.create`` does: a restore cut short after it made
    ``sessions/`` and before its parent's fsync leaves a ``sessions/`` that the rerun
    finds and never makes again, whose name a power loss could still take away.
    """
    directory = session_dir(home, session_id)
    durable.fsync_dir(os.path.dirname(directory))
    durable.fsync_dir(os.fspath(home))
