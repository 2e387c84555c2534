"""Mutants that break durability: what reaches the disk, and when the caller hears of it."""

from __future__ import annotations

import os

from worker.store import loader, session
from worker.store.baseline import Baseline
from worker.store.disk import durable
from worker.store.errors import SessionIOError
from worker.store.format.records import Record, encode_lines


def no_fsync() -> None:
    durable.fdatasync = lambda fd, path: None


def fsync_after_memory() -> None:
    def append_durably(self: session.Session, batch: list[Record]) -> None:
        self._check_writable()
        data, crc = encode_lines(batch, self._state.log_crc)
        self._state.records.extend(batch)  # the bug: memory first
        for offset, record in enumerate(batch):
            key = getattr(record, "key", None)
            if key is not None:
                self._state.keys[key] = loader.KeyRef(self._state.epoch, offset)
        fd = self._log_fd
        assert fd is not None
        try:
            durable.write_all(fd, data, self._log_path)
            durable.fdatasync(fd, self._log_path)
        except SessionIOError:
            self._broken = "failed"
            self._cut_back(fd, "failed")
            raise
        self._size += len(data)
        self._state.log_size, self._state.log_crc = self._size, crc

    session.Session._append_durably = append_durably  # type: ignore[method-assign]


def no_directory_fsync() -> None:
    durable.fsync_dir = lambda path: None


def fsync_retried_and_trusted() -> None:
    original = durable.fdatasync

    def fdatasync(fd: int, path: str) -> None:
        try:
            original(fd, path)
        except SessionIOError:
            original(fd, path)  # the bug: a second fsync "succeeds" on pages already lost

    durable.fdatasync = fdatasync


def directory_fsync_error_ignored() -> None:
    original = durable.fsync_dir

    def fsync_dir(path: str) -> None:
        try:
            original(path)
        except SessionIOError:
            return  # the bug: the names are taken as durable anyway

    durable.fsync_dir = fsync_dir


def rename_error_ignored() -> None:
    original = durable.rename

    def rename(source: str, target: str) -> None:
        try:
            original(source, target)
        except SessionIOError:
            return  # the bug: the new file is taken as in place

    durable.rename = rename


def short_write_not_looped() -> None:
    def write_all(fd: int, data: bytes, path: str) -> None:
        hook = durable._hook
        try:
            if hook is not None:
                hook(durable.Boundary(durable.Step.WRITE, path, fd, data))
            os.write(fd, data)  # the bug: a short count is taken as the whole buffer
        except OSError as exc:
            raise SessionIOError(path, exc.errno or 0, "write") from exc

    durable.write_all = write_all


def rename_before_data_fsync() -> None:
    def write_file_atomic(path: str, data: bytes, *, sync_dir: bool = True) -> None:
        tmp = path + durable.TMP_SUFFIX
        fd = durable.create(tmp)
        try:
            durable.write_all(fd, data, tmp)
            durable.rename(tmp, path)  # the bug: the name before the data is durable
            durable.fdatasync(fd, path)
        finally:
            durable.close(fd)
        if sync_dir:
            durable.fsync_dir(os.path.dirname(path) or ".")

    durable.write_file_atomic = write_file_atomic


def no_cut_back_after_failed_write() -> None:
    def cut_back(self: session.Session, fd: int, why_broken: str) -> None:
        return  # the bug: what a failed write left stays in the log

    session.Session._cut_back = cut_back  # type: ignore[method-assign]


def parent_fsync_skipped_on_create() -> None:
    original = durable.fsync_dir

    def fsync_dir(path: str) -> None:
        if os.path.basename(path) == "sessions":
            return  # the bug: the new session directory's name is never made durable
        original(path)

    durable.fsync_dir = fsync_dir


def epoch_end_not_fsynced() -> None:
    original = session.Session.commit_epoch

    def commit_epoch(self: session.Session, summary: str, baseline: Baseline) -> None:
        sync = durable.fdatasync
        if not self.epoch_closed:
            durable.fdatasync = lambda fd, path: None  # the bug: EpochEnd is not synced
        try:
            original(self, summary, baseline)
        finally:
            durable.fdatasync = sync

    session.Session.commit_epoch = commit_epoch  # type: ignore[method-assign]


def baseline_after_log() -> None:
    original = durable.write_file_atomic
    waiting: list[tuple[str, bytes]] = []

    def write_file_atomic(path: str, data: bytes, *, sync_dir: bool = True) -> None:
        if path.endswith(".baseline.json") and not path.endswith("/0.baseline.json"):
            waiting.append((path, data))  # the bug: the new baseline after the new log
            return
        original(path, data, sync_dir=sync_dir)
        while waiting:
            original(*waiting.pop(0))

    durable.write_file_atomic = write_file_atomic
