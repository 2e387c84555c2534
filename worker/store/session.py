"""The session store: one directory, one exclusive lock, an append-only log per epoch.

Durability rule: a record reaches memory only after its line was written whole and
``fdatasync`` returned; a failed write is cut back off the file, a failed fsync also
breaks the session (a failed fsync is never retried and trusted).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from types import TracebackType
from typing import Final

from worker.store.backend import SessionStore
from worker.store.baseline import Baseline
from worker.store.batch_rules import fence_after, highest_call_after, newest_usage
from worker.store.creation import check_slot, make_opened_durable, sync_parents, write_first_epoch
from worker.store.disk import durable
from worker.store.disk.files import Directory
from worker.store.disk.layout import ensure_sessions_dir, home_of, lock_existing, session_dir
from worker.store.disk.lock import lock_directory, unlock_directory
from worker.store.disk.scan_file import read_summary, write_summary
from worker.store.epochs.carried_state import NextEpoch, plan_next_epoch
from worker.store.epochs.epoch_commit import switch_to_next_epoch, write_next_epoch
from worker.store.epochs.epoch_log import key_applied_at
from worker.store.errors import (
    EpochClosed,
    InvalidRecord,
    SessionBroken,
    SessionExists,
    SessionIOError,
    quote,
)
from worker.store.format.kept_scan import KeptScan
from worker.store.format.records import (
    EpochEnd,
    Record,
    SessionStart,
    Usage,
    User,
    encode_lines,
)
from worker.store.format.scan_summary import encode as encode_summary
from worker.store.key_index import KeyIndex, remove_stale
from worker.store.loader import KeyRef, SessionState, load_session, log_path
from worker.store.session_view import SessionView
from worker.store.stats import STATS

_Home = str | os.PathLike[str] | SessionStore["Session"]
_EXISTS: Final = frozenset({errno.EEXIST})
_WRITTEN_BY_THE_STORE: Final = frozenset({SessionStart, EpochEnd})
_NEW_KEYS_KEPT: Final = 4096
# Called by name from here (the chaos rig's mutant and the benchmark replace it).
_make_durable = make_opened_durable


class Session(SessionView):
    """An open session: holds the directory lock and appends to the newest epoch's log."""

    def __init__(self, state: SessionState, lock_fd: int, log_fd: int) -> None:
        """Wrap an already locked and loaded session; use ``create`` or ``open``."""
        self._state = state
        self._lock_fd: int | None = lock_fd
        self._log_fd: int | None = log_fd
        self._log_path = log_path(state.directory, state.epoch)
        self._size = state.log_size
        self._next_call = state.next_call
        self._broken: str | None = None
        self._last_usage = newest_usage(state.records)
        # Keys find_key found in no epoch: only this session writes, so they stay new
        # until it appends them, and append need not look them up again (bounded).
        self._new_keys: set[str] = set()
        self._kept, state.kept_scan = state.kept_scan, None  # its scan summary, kept going

    # -- construction ---------------------------------------------------------------

    @classmethod
    def create(cls, home: _Home, session_id: str, baseline: Baseline, slot: int = 0) -> Session:
        """Create a new session in ``home`` (or another store); SessionExists if it exists."""
        if not isinstance(home, str | os.PathLike):
            return home.create_session(session_id, baseline, slot)
        directory = session_dir(home, session_id)
        check_slot(slot)
        ensure_sessions_dir(os.path.dirname(directory))
        try:
            durable.mkdir(directory)
        except SessionIOError as exc:
            if exc.errno in _EXISTS:
                raise SessionExists(directory) from exc
            raise
        # Every name on the way is fsynced, not only the new one: an earlier create may
        # have made sessions/ and failed to make its name durable (a failed directory
        # fsync is not retried by anyone else).
        sync_parents(directory)
        return cls._initialize(directory, session_id, baseline, slot, lock_directory(directory))

    @classmethod
    def open(cls, home: _Home, session_id: str) -> Session:
        """Open an existing session (lock, read, check); SessionNotFound without 0.jsonl."""
        if not isinstance(home, str | os.PathLike):
            return home.open_session(session_id)
        directory = session_dir(home, session_id)
        lock_fd = lock_existing(directory)
        try:
            known = read_summary(home, session_id)
            state = load_session(directory, session_id, dir_fd=lock_fd, known=known, summarize=True)
            log_fd = durable.open_append(log_path(directory, state.epoch))
        except BaseException:
            unlock_directory(lock_fd)
            raise
        try:
            _make_durable(state, log_fd)
            # Its newest Usage is decoded here: a line that does not decode is refused
            # with the lock and the log let go, as any refusal of open is.
            session = cls(state, lock_fd, log_fd)
        except BaseException:
            durable.close(log_fd)
            unlock_directory(lock_fd)
            raise
        if state.scan_summary is not None:  # a cache: kept if it can be, else no matter
            write_summary(home, session_id, encode_summary(state.scan_summary))
            state.scan_summary = None
        return session

    @classmethod
    def open_or_create(
        cls, home: _Home, session_id: str, baseline: Baseline, slot: int = 0
    ) -> Session:
        """Open the session, creating it if absent or finishing a create that was cut short.

        A directory with no epoch log at all is a create that crashed before its
        ``0.jsonl`` was renamed into place; nothing of it was ever acknowledged, so it
        is initialized afresh (stray ``*.tmp`` and baseline files are replaced).
        """
        if not isinstance(home, str | os.PathLike):
            return home.open_or_create(session_id, baseline, slot)
        directory = session_dir(home, session_id)
        check_slot(slot)
        if not os.path.isdir(directory):
            try:
                return cls.create(home, session_id, baseline, slot)
            except SessionExists:
                pass  # a concurrent creator won the mkdir; open what it made
        lock_fd = lock_existing(directory)
        if any(name.endswith(".jsonl") for name in os.listdir(lock_fd)):
            unlock_directory(lock_fd)
            return cls.open(home, session_id)
        try:
            # The create that was cut short may have died before its directory's name
            # was made durable, or its fsync may have failed: redo it before writing.
            sync_parents(directory)
        except BaseException:
            unlock_directory(lock_fd)
            raise
        return cls._initialize(directory, session_id, baseline, slot, lock_fd)

    @classmethod
    def _initialize(
        cls, directory: str, session_id: str, baseline: Baseline, slot: int, lock_fd: int
    ) -> Session:
        """Write epoch 0 into the locked, log-less ``directory``; the session takes the lock."""
        try:
            state, log_fd = write_first_epoch(directory, session_id, baseline, slot)
        except BaseException:
            unlock_directory(lock_fd)
            raise
        session = cls(state, lock_fd, log_fd)
        session.keep_summary()
        return session

    # -- attributes -------------------------------------------------------------------

    @property
    def log_path(self) -> str:
        """The path of the current epoch's log."""
        return self._log_path

    @property
    def broken(self) -> str | None:
        """Why the session refuses appends after a failed write or fsync, else None."""
        return self._broken

    def find_key(self, key: str, seen_epoch: int | None = None) -> KeyRef | None:
        """Return where the request ``key`` was applied, in any epoch of the session, or None.

        The current and the previous epoch's keys are in memory; an older one is found
        through the key index and confirmed by its line in the sealed log, so a key is
        applied once for the life of the session and a new key is never taken for an
        old one (docs/format.md, "The key index"); an unreadable sealed log raises.
        ``seen_epoch`` is ignored (accepted for Apps written for the old retry window).
        """
        del seen_epoch
        state = self._state
        ref = state.keys.get(key)
        if ref is not None or not state.key_index.segments:
            return ref

        def confirm(epoch: int, line: int) -> bool:
            return key_applied_at(self.files(), log_path(state.directory, epoch), line, key)

        found = state.key_index.find(key, confirm)
        if found is not None:
            return KeyRef(*found)
        if len(self._new_keys) >= _NEW_KEYS_KEPT:
            self._new_keys.clear()
        self._new_keys.add(key)
        return None

    def _applied(self, key: str) -> bool:
        return key not in self._new_keys and self.find_key(key) is not None

    def next_call(self) -> int:
        """Hand out the next tool call number: 1, 2, 3 ... across epochs, never reused."""
        number = self._next_call
        self._next_call += 1
        return number

    def last_usage(self) -> Usage | None:
        """Return the newest Usage of the current epoch, or None."""
        return self._last_usage

    # -- writing ------------------------------------------------------------------------

    def append(self, record: Record) -> None:
        """Append one record durably; it is in memory only once on disk."""
        self.append_many((record,))

    def append_many(self, records: Iterable[Record]) -> None:
        """Append records with one write and one fsync (group commit)."""
        batch = list(records)
        for record in batch:
            if type(record) in _WRITTEN_BY_THE_STORE:
                raise InvalidRecord(
                    record.TYPE, "is written by create and commit_epoch, not by append"
                )
        if batch:
            self._append_durably(batch)

    def commit_epoch(self, summary: str, baseline: Baseline) -> None:
        """Close the epoch with EpochEnd and start the next one (two phases, crash-safe).

        If the log already ends with EpochEnd (an interrupted change), its summary is
        used and ``summary`` is ignored: resume never writes a second EpochEnd.
        """
        self._check_writable(allow_closed=True)
        state = self._state
        last = state.records[-1]
        # What the next SessionStart carries, computed from what the log holds: the
        # EpochEnd records its digest, and a resume computes the same (open checks it).
        plan = plan_next_epoch(state)
        if isinstance(last, EpochEnd):
            summary = last.summary
            # The form it recorded: one begun before the fence was carried carries none
            # (open has checked that the EpochEnd's digest is of one of the two).
            plan = plan.matching(last.carried) or plan
        else:
            if type(summary) is not str:
                raise InvalidRecord("EpochEnd", f"summary must be a string, got {quote(summary)}")
            end = EpochEnd(next=state.epoch + 1, summary=summary, carried=plan.digest)
            self._append_durably([end])
        try:
            start, line, crc = self._write_next_epoch(plan, baseline)
        except SessionIOError as exc:
            # What reached the disk is unknown after a failed step; the next open reads it.
            self._broken = f"epoch change to {state.epoch + 1} failed: {exc}"
            raise
        switch_to_next_epoch(state, plan, start, baseline, summary, len(line), crc)
        self._log_path = log_path(state.directory, state.epoch)
        self._size = len(line)
        self._last_usage = None
        self._kept = KeptScan(state.epoch, None, bytearray(line))  # before a step can fail
        self._remove_stale(plan.index)
        self.keep_summary()

    # -- the durable steps: the file store's, overridden by another backend ------------

    def files(self) -> Directory:
        """The session's files to read (the locked directory's fd; another backend's own
        files), a sealed log's too; SessionBroken if closed."""
        if self._lock_fd is None:
            raise SessionBroken(self._log_path, "session is closed")
        return self._lock_fd

    def _write_next_epoch(
        self, plan: NextEpoch, baseline: Baseline
    ) -> tuple[SessionStart, bytes, int]:
        """Phase 2: the next epoch's files, durable; its SessionStart, first lines, CRC-32."""
        start, line, crc, new_fd = write_next_epoch(self._state, plan, baseline)
        old_fd, self._log_fd = self._log_fd, new_fd
        if old_fd is not None:
            durable.close(old_fd)
        return start, line, crc

    def keep_summary(self) -> None:
        """A new scan summary of the newest log, when what was appended since the last is
        worth one (``worker.store.format.kept_scan``); a cache: nothing fails for it."""
        kept = self._kept
        if kept is None or not kept.due():
            return
        summary = kept.take()
        if summary is None:
            self._kept = None  # lines no scan reads: the next open decodes them anyway
            return
        self._put_summary(encode_summary(summary))

    def _put_summary(self, blob: bytes) -> None:
        state = self._state  # where the next open looks: <home>/scans
        write_summary(home_of(state.directory), state.session_id, blob)

    def _remove_stale(self, index: KeyIndex) -> None:
        assert self._lock_fd is not None  # open while the log is
        remove_stale(self._lock_fd, self._state.directory, index)

    def _check_writable(self, *, allow_closed: bool = False) -> None:
        if self._log_fd is None:
            raise SessionBroken(self._log_path, "session is closed")
        if self._broken is not None:
            raise SessionBroken(self._log_path, self._broken)
        if not allow_closed and isinstance(self._state.records[-1], EpochEnd):
            raise EpochClosed(self._log_path, self._state.epoch)

    def _append_durably(self, batch: list[Record]) -> None:
        self._check_writable()
        state = self._state
        fence = fence_after(state.fence, batch, self._log_path)
        data, crc = encode_lines(batch, state.log_crc)  # validates every field first
        highest = highest_call_after(state, batch, self._applied)
        self._write_group(data)
        # Durable: only now does memory learn of the records.
        first_line = len(state.records) + 1
        state.records.extend(batch)
        self._size += len(data)
        state.log_size = self._size
        state.log_crc = crc
        state.max_call = highest
        state.fence = fence
        self._next_call = max(self._next_call, highest + 1)
        for offset, record in enumerate(batch):
            if isinstance(record, Usage):
                self._last_usage = record
                STATS.prompt_tokens += record.prompt_tokens
                STATS.completion_tokens += record.completion_tokens
            elif isinstance(record, User) and record.key is not None:
                state.keys[record.key] = KeyRef(state.epoch, first_line + offset)
                self._new_keys.discard(record.key)
        if self._kept is not None:
            self._kept.add(data)
            self.keep_summary()

    def _write_group(self, data: bytes) -> None:
        """Append one group commit's lines to the log: write, then fdatasync."""
        fd = self._log_fd
        assert fd is not None  # _check_writable
        try:
            durable.write_all(fd, data, self._log_path)
        except SessionIOError:
            self._cut_back(fd, "write failed and the file could not be cut back")
            raise
        try:
            durable.fdatasync(fd, self._log_path)
        except SessionIOError as exc:
            # fsyncgate: after a failed fsync the kernel may have dropped the dirty
            # pages and cleared the error, so a retry could "succeed" on lost data.
            self._broken = f"fdatasync failed: {exc}"
            self._cut_back(fd, self._broken)
            raise

    def _cut_back(self, fd: int, why_broken: str) -> None:
        """Truncate the log to its last good length; break the session if that fails."""
        try:
            durable.truncate(fd, self._size, self._log_path)
        except SessionIOError:
            self._broken = why_broken

    # -- closing ------------------------------------------------------------------------

    def close(self) -> None:
        """Close the log and release the lock; idempotent."""
        log_fd, self._log_fd = self._log_fd, None
        lock_fd, self._lock_fd = self._lock_fd, None
        if log_fd is not None:
            durable.close(log_fd)
        if lock_fd is not None:
            unlock_directory(lock_fd)

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Session(id={self.id!r}, epoch={self.epoch}, records={len(self._state.records)})"
