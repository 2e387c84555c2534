"""Deliberately broken stores, applied by monkeypatching inside a case's child only.

Each breaks one rule of the store; the rig must catch every one (``loopd chaos
mutants``). They live here, never in worker/, and never run outside a forked child.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final

from worker import durable, layout, loader, lock, session
from worker.baseline import Baseline
from worker.errors import SessionIOError, TornLog
from worker.records import EpochEnd, Record, encode_records


def _no_fsync() -> None:
    durable.fdatasync = lambda fd, path: None


def _fsync_after_memory() -> None:
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


def _no_directory_fsync() -> None:
    durable.fsync_dir = lambda path: None


def _second_epoch_end_on_resume() -> None:
    original = session.Session.commit_epoch

    def commit_epoch(self: session.Session, summary: str, baseline: Baseline) -> None:
        if isinstance(self._state.records[-1], EpochEnd):
            # The bug: close the epoch again instead of resuming with the recorded one.
            data = encode_records([EpochEnd(next=self.epoch + 1, summary=summary)])
            assert self._log_fd is not None
            durable.write_all(self._log_fd, data, self._log_path)
            durable.fdatasync(self._log_fd, self._log_path)
        original(self, summary, baseline)

    session.Session.commit_epoch = commit_epoch  # type: ignore[method-assign]


def _recorded_summary_rewritten() -> None:
    original = session.Session.commit_epoch

    def commit_epoch(self: session.Session, summary: str, baseline: Baseline) -> None:
        last = self._state.records[-1]
        if isinstance(last, EpochEnd) and last.summary != summary:
            # The bug: "refresh" the recorded summary with the caller's, in place.
            line = encode_records([EpochEnd(time=last.time, next=last.next, summary=summary)])
            old = encode_records([last])
            assert self._log_fd is not None
            os.ftruncate(self._log_fd, self._size - len(old))
            os.write(self._log_fd, line)
            os.fsync(self._log_fd)
            self._size += len(line) - len(old)
            self._state.records[-1] = EpochEnd(time=last.time, next=last.next, summary=summary)
        original(self, summary, baseline)

    session.Session.commit_epoch = commit_epoch  # type: ignore[method-assign]


def _call_numbers_per_epoch() -> None:
    original = session.Session.commit_epoch

    def commit_epoch(self: session.Session, summary: str, baseline: Baseline) -> None:
        original(self, summary, baseline)
        # The bug: tool call numbers start again in every epoch.
        self._state.max_call = 0
        self._next_call = 1

    session.Session.commit_epoch = commit_epoch  # type: ignore[method-assign]


def _silent_torn_tail_repair() -> None:
    original = loader.decode_log

    def decode_log(path: str, data: bytes) -> loader.DecodedLog:
        try:
            return original(path, data)
        except TornLog:
            if data.endswith(b"\n"):
                raise
            keep = data[: data.rfind(b"\n") + 1]
            os.truncate(path, len(keep))  # the bug: repair without being asked
            return original(path, keep)

    loader.decode_log = decode_log


def _no_lock() -> None:
    def lock_directory(path: str, *, shared: bool = False) -> int:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)

    # Every module that took the name at import time.
    session.lock_directory = lock_directory  # type: ignore[attr-defined]
    layout.lock_directory = lock_directory  # type: ignore[attr-defined]
    lock.lock_directory = lock_directory


MUTANTS: Final[dict[str, Callable[[], None]]] = {
    "no-fsync": _no_fsync,
    "fsync-after-memory": _fsync_after_memory,
    "no-directory-fsync": _no_directory_fsync,
    "second-epoch-end-on-resume": _second_epoch_end_on_resume,
    "silent-torn-tail-repair": _silent_torn_tail_repair,
    "recorded-summary-rewritten": _recorded_summary_rewritten,
    "call-numbers-per-epoch": _call_numbers_per_epoch,
    "no-lock": _no_lock,
}


def apply(name: str | None) -> None:
    """Break the store in this process as the mutant ``name`` says (None: leave it whole)."""
    if name is None:
        return
    if name not in MUTANTS:
        raise ValueError(f"unknown mutant {name!r}; known: {', '.join(MUTANTS)}")
    MUTANTS[name]()
