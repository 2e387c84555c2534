"""Mutants that break durability: what reaches the disk, and when the caller hears of it."""

from __future__ import annotations

from worker import durable, loader, session
from worker.errors import SessionIOError
from worker.records import Record, encode_records


def no_fsync() -> None:
    durable.fdatasync = lambda fd, path: None


def fsync_after_memory() -> None:
    def append_durably(self: session.Session, batch: list[Record]) -> None:
        self._check_writable()
        data = encode_records(batch)
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

    session.Session._append_durably = append_durably  # type: ignore[method-assign]


def no_directory_fsync() -> None:
    durable.fsync_dir = lambda path: None
