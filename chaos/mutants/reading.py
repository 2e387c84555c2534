"""Mutants that break reading a session: refusals, repairs and the lock."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from worker.store import loader, session
from worker.store.baseline import Baseline
from worker.store.disk import layout, lock
from worker.store.epochs import epoch_log
from worker.store.errors import SessionLocked, TornLog
from worker.store.format import line_scan, scan_summary
from worker.store.format.line_scan import LineScan
from worker.store.format.records import EpochEnd, ToolResult
from worker.store.format.scan_summary import ScanSummary


def silent_torn_tail_repair() -> None:
    original = epoch_log.decode_log

    def decode_log(path: str, data: bytes, *, canonical: bool = False) -> loader.DecodedLog:
        try:
            return original(path, data, canonical=canonical)
        except TornLog:
            if data.endswith(b"\n"):
                raise
            keep = data[: data.rfind(b"\n") + 1]
            os.truncate(path, len(keep))  # the bug: repair without being asked
            return original(path, keep, canonical=canonical)

    epoch_log.decode_log = decode_log


def no_lock() -> None:
    def lock_directory(path: str, *, shared: bool = False) -> int:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)

    _patch_lock(lock_directory)


def _patch_lock(lock_directory: Callable[..., int]) -> None:
    # Every module that took the name at import time.
    session.lock_directory = lock_directory  # type: ignore[attr-defined]
    layout.lock_directory = lock_directory  # type: ignore[attr-defined]
    lock.lock_directory = lock_directory


def writer_takes_shared_lock() -> None:
    original = lock.lock_directory

    def lock_directory(path: str, *, shared: bool = False) -> int:
        return original(path, shared=True)  # the bug: a writer shares the lock

    _patch_lock(lock_directory)


def held_lock_taken_as_stale() -> None:
    original = lock.lock_directory

    def lock_directory(path: str, *, shared: bool = False) -> int:
        try:
            return original(path, shared=shared)
        except SessionLocked:
            # The bug: a held lock is taken for a stale one and the opener goes on.
            return os.open(path, os.O_RDONLY | os.O_DIRECTORY)

    _patch_lock(lock_directory)


def open_forgets_prior_counts() -> None:
    original = loader.load_session

    def load_session(session_dir: str, session_id: str, **kwargs: Any) -> loader.SessionState:
        state = original(session_dir, session_id, **kwargs)
        state.prior_users = state.prior_untrusted = 0  # the bug: counted in memory only
        return state

    session.load_session = load_session  # type: ignore[attr-defined]


def open_carries_oldest_summary() -> None:
    original = loader.load_session

    def load_session(session_dir: str, session_id: str, **kwargs: Any) -> loader.SessionState:
        state = original(session_dir, session_id, **kwargs)
        if state.epoch >= 2:
            first = loader.log_path(session_dir, 0)
            with open(first, "rb") as f:
                last = loader.decode_log(first, f.read()).records[-1]
            if isinstance(last, EpochEnd):
                state.carry = last.summary  # the bug: the first epoch's summary
        return state

    session.load_session = load_session  # type: ignore[attr-defined]


def key_index_current_epoch_only() -> None:
    original = session.Session.find_key

    def find_key(
        self: session.Session, key: str, seen_epoch: int | None = None
    ) -> loader.KeyRef | None:
        ref = original(self, key, seen_epoch)
        return ref if ref is not None and ref.epoch == self.epoch else None  # the bug

    session.Session.find_key = find_key  # type: ignore[method-assign]


def torn_tail_ignored() -> None:
    original = epoch_log.decode_log

    def decode_log(path: str, data: bytes, *, canonical: bool = False) -> loader.DecodedLog:
        # The bug: an unterminated last line is skipped, not refused (and later appends
        # land after it).
        return original(path, data[: data.rfind(b"\n") + 1], canonical=canonical)

    epoch_log.decode_log = decode_log


def lock_released_after_open() -> None:
    original = session.Session.open

    def open_session(home: str, session_id: str) -> session.Session:
        opened = original(home, session_id)
        lock_fd, opened._lock_fd = opened._lock_fd, None
        if lock_fd is not None:
            os.close(lock_fd)  # the bug: the lock is dropped once the files are read
        return opened

    session.Session.open = staticmethod(open_session)  # type: ignore[method-assign,assignment]


def next_call_from_newest_epoch() -> None:
    original = loader.load_session

    def load_session(session_dir: str, session_id: str, **kwargs: Any) -> loader.SessionState:
        state = original(session_dir, session_id, **kwargs)
        # The bug: only the newest epoch's tool calls are counted (the number the epoch's
        # SessionStart carries, and every older epoch, are ignored).
        calls = [r.call for r in state.records if isinstance(r, ToolResult)]
        state.max_call = max(calls, default=0)
        state.next_call = state.max_call + 1
        return state

    session.load_session = load_session  # type: ignore[attr-defined]


def open_or_create_always_initializes() -> None:
    def open_or_create(
        home: str, session_id: str, baseline: Baseline, slot: int = 0
    ) -> session.Session:
        directory = layout.session_dir(home, session_id)
        if not os.path.isdir(directory):
            return session.Session.create(home, session_id, baseline, slot)
        # The bug: an existing session is written afresh instead of opened.
        lock_fd = layout.lock_existing(directory)
        return session.Session._initialize(directory, session_id, baseline, slot, lock_fd)

    session.Session.open_or_create = staticmethod(open_or_create)  # type: ignore[method-assign,assignment]


def incomplete_group_accepted() -> None:
    # The bug: the parts of a group commit are not checked, so a group cut short by a
    # torn write reads as whole lines, and its key as applied.
    epoch_log.check_groups = lambda path, records, framed: None


def open_makes_nothing_durable() -> None:
    # The bug (the store before issue 7): what open read stays in the page cache, so a
    # power loss after the resumed worker acknowledged more work takes it away.
    session._make_durable = lambda state, log_fd: None


def _scanned_then(change: Callable[[LineScan, ScanSummary | None, bytes, int], None]) -> None:
    """Open's scan of the newest log, then ``change`` made to what it read."""
    original = line_scan.scan_lines

    def scan_lines(
        data: bytes, known: ScanSummary | None = None, epoch: int = 0
    ) -> LineScan | None:
        scan = original(data, known, epoch)
        if scan is not None:
            change(scan, known, data, epoch)
        return scan

    epoch_log.scan_lines = scan_lines  # type: ignore[attr-defined]


def open_scan_drops_keys() -> None:
    def change(scan: LineScan, _known: ScanSummary | None, _data: bytes, _epoch: int) -> None:
        # The bug: the scan that replaced decoding at open misreads every User's key
        # as sent without one, so a retry of a key of the open epoch is new again.
        scan.keys = [None] * len(scan.keys)

    _scanned_then(change)


def summary_tail_keys_dropped() -> None:
    def change(scan: LineScan, known: ScanSummary | None, data: bytes, epoch: int) -> None:
        said = known.read() if known is not None and known.covers(data, epoch) else None
        if said is not None:
            # The bug: the keys of the lines after the summary are read as sent without
            # one (the tail's scan merged with the summary's types but not its keys).
            kept = len(said.keys)
            scan.keys = [*scan.keys[:kept], *[None] * (len(scan.keys) - kept)]

    _scanned_then(change)


def summary_written_wrong() -> None:
    original = line_scan.LineScan.summary

    def summary(self: LineScan, epoch: int, data: bytes) -> ScanSummary | None:
        # The bug: the summary leaves out the newest User's key, so its lists no longer
        # agree and no open takes it (each scans its log whole): only a look at the
        # summary itself sees it.
        wrong = dataclasses.replace(self, keys=self.keys[:-1]) if self.keys else self
        return original(wrong, epoch, data)

    line_scan.LineScan.summary = summary  # type: ignore[method-assign]


def kept_summary_drops_a_call() -> None:
    original = scan_summary.ScanSummary.followed_by

    def followed_by(
        self: ScanSummary, tail: bytes, types: list[Any], calls: list[int], keys: list[Any]
    ) -> ScanSummary | None:
        # The bug: the summary a writer keeps as its log grows leaves out the newest call
        # it appended, so its lists no longer agree and no open takes it: only a look at
        # the summary itself sees it.
        return original(self, tail, types, calls[:-1], keys)

    scan_summary.ScanSummary.followed_by = followed_by  # type: ignore[method-assign]
