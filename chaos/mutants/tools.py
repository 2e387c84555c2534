"""Mutants of the operator's tools: backup, restore and the key index rebuild (docs/chaos.md)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from datetime import UTC, datetime

from worker.offline import backup, index_repair, restore, salvage
from worker.offline.repair import make_dirs
from worker.offline.restore_drops import NOTHING
from worker.offline.trash import move_to_trash
from worker.store.disk import durable
from worker.store.disk.files import open_directory, read_file
from worker.store.disk.layout import session_dir
from worker.store.key_index import Segment
from worker.store.loader import load_session


def restore_skips_manifest_check() -> None:
    def check_backup(source: str) -> restore.Manifest:
        # The bug: the files are taken as they are, without the manifest that says the
        # backup was finished and what it holds.
        fd = open_directory(source)
        try:
            files = {
                name: read_file(fd, name, os.path.join(source, name))
                for name in os.listdir(fd)
                if restore._NAME.fullmatch(name)
            }
        finally:
            os.close(fd)
        session = os.path.basename(source).removesuffix(backup.PARTIAL)
        return restore.Manifest(session, "", files, None)

    restore.check_backup = check_backup


def backup_manifest_before_fsync() -> None:
    def write(
        target: str,
        session_id: str,
        point: backup.Point,
        contents: dict[str, bytes],
        left: int,
        app: str | None,
        owner: tuple[str, str] | None,
    ) -> backup.BackupResult:
        partial = target + backup.PARTIAL
        make_dirs(partial)
        files = []
        for name, data in sorted(contents.items()):
            fd = durable.create(os.path.join(partial, name))
            try:
                durable.write_all(fd, data, name)  # the bug: no fsync before the manifest
            finally:
                durable.close(fd)
            files.append(
                {"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            )
        manifest = {
            "format": backup.FORMAT, "session": session_id,
            "taken": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "point": {"epoch": point.epoch, "bytes": point.size, "named_by": point.named_by},
            "files": files,
        }  # fmt: skip
        text = json.dumps(manifest, indent=1, sort_keys=True).encode() + b"\n"
        durable.write_file_atomic(os.path.join(target + backup.PARTIAL, backup.MANIFEST), text)
        durable.rename(partial, target)
        durable.fsync_dir(os.path.dirname(target) or ".")
        for name in sorted(contents):
            durable.fsync_file(os.path.join(target, name))  # ... only once it is in place
        size = sum(len(d) for d in contents.values())
        return backup.BackupResult(target, point, len(files), size, None, left)

    backup._write = write


def restore_without_staging() -> None:
    def restore_session(
        home: str | os.PathLike[str],
        source: str,
        session_id: str | None,
        *,
        replace: bool,
        dropping: str = "",
    ) -> restore.RestoreResult:
        manifest = restore.check_backup(source)
        wanted = manifest.session if session_id is None else session_id
        directory = session_dir(home, wanted)
        replaced = move_to_trash(home, wanted) if replace and os.path.lexists(directory) else None
        # The bug: the files are written where the session lives, one by one, instead
        # of into the trash and renamed into place in one step.
        make_dirs(directory)
        for name, data in sorted(manifest.files.items()):
            durable.write_file_atomic(os.path.join(directory, name), data, sync_dir=False)
        durable.fsync_dir(directory)
        load_session(directory, wanted, history=True)
        return restore.RestoreResult(directory, manifest, replaced, NOTHING)

    restore.restore_session = restore_session


def index_rebuild_without_fsync() -> None:
    def write_segments(directory: str, segments: Iterable[Segment]) -> None:
        for segment in segments:
            path = os.path.join(directory, segment.name)
            fd = durable.create(path + durable.TMP_SUFFIX)
            try:
                # The bug: "the index is derived", so its files are not fsynced; the
                # directory fsync after them makes their names durable, not their bytes.
                durable.write_all(fd, segment.data(), path)
            finally:
                durable.close(fd)
            durable.rename(path + durable.TMP_SUFFIX, path)

    index_repair.write_segments = write_segments  # type: ignore[attr-defined]


def salvage_truncates_before_quarantine() -> None:
    real = durable  # the module salvage writes through
    pending: list[tuple[str, bytes]] = []

    class Reordered:
        """The store's durable module, but the cut lines' write waits for the truncation."""

        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        @staticmethod
        def write_file_atomic(path: str, data: bytes, **options: bool) -> None:
            if path.endswith(".jsonl.cut"):
                pending.append((path, data))
                return
            real.write_file_atomic(path, data, **options)

        @staticmethod
        def truncate(fd: int, length: int, path: str) -> None:
            real.truncate(fd, length, path)
            # The bug: the cut lines reach the quarantine only after the log lost them.
            while pending:
                real.write_file_atomic(*pending.pop(0))

    salvage.durable = Reordered()  # type: ignore[attr-defined,assignment]


def salvage_quarantine_name_not_synced() -> None:
    # The bug: only the new directories' names are fsynced (make_dirs); a quarantine/
    # a cut-short run made is found by the rerun and never made durable.
    salvage._sync_quarantine = lambda *_args, **_options: None
