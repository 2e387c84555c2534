"""Read and validate a session directory without changing a byte of it.

``load_session`` is the whole of ``open``'s reading. A session whose newest
``SessionStart`` carries all the state of the older epochs is opened from its newest
epoch, the key index files it names, and the previous log's last line (its
``EpochEnd``: the carry, the chain, the digest of the carried state). A session written
before, or a reader asking for the history (``loopd verify``, ``inspect --all``), reads
every epoch and checks every carried field and the key index against them. Nothing is
repaired: the first problem is raised as TornLog, InvalidLog or BaselineError with its
place.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from itertools import compress, repeat
from operator import is_not

from worker.store.disk.files import Directory, open_directory, read_file
from worker.store.epochs.carried_checks import (
    EpochEndAt,
    check_carried_digest,
    check_carried_fields,
    check_index_against_history,
    check_planned_digest,
)
from worker.store.epochs.carried_state import parse_recent_keys
from worker.store.epochs.epoch_files import list_epochs, load_baseline
from worker.store.epochs.epoch_log import (
    DecodedLog,
    check_epoch,
    check_groups,
    cyclic_gc_paused,
    decode_log,
    key_applied_at,
    read_log,
    refuse_reused_call,
    session_of_sealed,
)
from worker.store.epochs.sealed_logs import check_sealed, first_start, previous_end
from worker.store.errors import InvalidLog, quote
from worker.store.fencing import NO_FENCE, Fence, advance
from worker.store.format.epoch_records import EpochRecords
from worker.store.format.kept_scan import KeptScan, kept_after_open
from worker.store.format.records import (
    EpochEnd,
    Handoff,
    Owner,
    Record,
    SessionStart,
    User,
)
from worker.store.format.scan_summary import ScanSummary
from worker.store.key_index import KeyIndex, load_index
from worker.store.session_state import KeyRef, SessionState, baseline_path, log_path
from worker.store.unfinished_salvage import refuse_unfinished_salvage

__all__ = [
    "DecodedLog",
    "KeyRef",
    "SessionState",
    "baseline_path",
    "check_epoch",
    "check_groups",
    "decode_log",
    "list_epochs",
    "load_baseline",
    "load_session",
    "log_path",
]


def load_session(
    session_dir: str,
    session_id: str,
    *,
    on_epoch: Callable[[Sequence[Record]], None] | None = None,
    dir_fd: Directory | None = None,
    newest_data: bytes | None = None,
    history: bool = False,
    index_files: bool = True,
    canonical: bool = False,
    known: ScanSummary | None = None,
    summarize: bool = False,
) -> SessionState:
    """Read and check the session in ``session_dir``; change nothing.

    Files are read relative to ``dir_fd`` (the session directory's open fd, e.g. the
    one holding its lock, or another backend's files: ``worker.store.backend``), or
    to an fd of ``session_dir`` opened without following a link. ``on_epoch`` sees
    each epoch read, oldest first. With ``newest_data`` those bytes stand for the
    newest log's (repair checks a cut with it). With ``history`` every epoch is read
    and every carried field checked against it; with ``history`` and not
    ``index_files`` the key index is rebuilt from the logs, its files left unread.
    With ``canonical`` every line read must be the writer's own bytes for its record,
    not only carry a matching checksum (``loopd verify``; open trusts the checksum).
    ``known``: a summary of an earlier scan of the newest log (the scan then reads only
    what follows it); with ``summarize`` (open, which keeps it) the state's
    ``scan_summary`` is one of this read's scan, when it scanned enough to be worth
    keeping (``worker.store.format.scan_summary``).
    """
    fd = open_directory(session_dir) if dir_fd is None else dir_fd
    try:
        reader = _Reader(session_dir, session_id, fd, on_epoch, newest_data)
        reader.canonical = canonical
        reader.known, reader.summarize = known, summarize
        with cyclic_gc_paused():
            return reader.load(history, index_files)
    finally:
        if dir_fd is None and isinstance(fd, int):
            os.close(fd)


class _Reader:
    """One reading of a session: the epochs it reads and what they add up to."""

    def __init__(
        self,
        directory: str,
        session_id: str,
        dir_fd: Directory,
        on_epoch: Callable[[Sequence[Record]], None] | None,
        newest_data: bytes | None,
    ) -> None:
        self.directory = directory
        self.session_id = session_id
        self.dir_fd = dir_fd
        self.on_epoch = on_epoch
        self.newest_data = newest_data
        self.sizes: list[int] = []
        self.keys: dict[str, KeyRef] = {}
        self.repeats: list[tuple[str, KeyRef]] = []
        self.index = KeyIndex()
        self.max_call = 0
        self.next_call = 1
        self.prior_users = self.prior_untrusted = 0
        self.carry: str | None = None
        self.fence = NO_FENCE
        self.fence_known = True  # False: the newest SessionStart predates the carried fence
        self.crc = 0  # of the newest log
        self.starts: dict[int, SessionStart | None] = {}  # each epoch's, once read
        self.canonical = False  # every line's spelling checked, not only its checksum
        # Each epoch read: its ToolResults' calls, the line of each User and its key.
        self.scans: dict[int, tuple[list[int], list[int], list[str | None]]] = {}
        self.known: ScanSummary | None = None  # of an earlier scan of the newest log
        self.summary: ScanSummary | None = None  # of this read's, to keep
        self.kept: KeptScan | None = None  # the newest log, for its writer to keep summarized
        self.summarize = False  # whether to make ``summary`` (only open keeps one)

    def load(self, history: bool, index_files: bool = True) -> SessionState:
        refuse_unfinished_salvage(self.directory, self.dir_fd)  # before its epochs: a gap
        epochs = list_epochs(self.directory, self.dir_fd)
        newest = epochs[-1]
        path, records = self._read(newest, newest=True)
        first = records[0]
        assert isinstance(first, SessionStart)  # check_epoch guarantees it
        if newest > 0 and first.key_index is not None and not history:
            # The newest epoch carries all that open needs of the older ones, bound by
            # the digest in the EpochEnd before it, and the key index finds their keys.
            first_read = newest
            self._take_carried(path, first, newest)
            self.starts[newest] = first
            end = previous_end(self.dir_fd, self.directory, newest, first)
            self.carry = end.record.summary
            check_carried_digest(path, first, end)
            self.index = load_index(self.dir_fd, self.directory, path, newest, first.key_index)
            self._count(path, newest, records, newest=True)
        else:
            # Written before the key index existed (or the history is asked for): every
            # epoch is read, and every carried field checked against what it holds.
            first_read = 0
            newest_size = self.sizes.pop()
            closing: EpochEndAt | None = None
            for epoch in epochs[:-1]:
                older_path, older = self._read(epoch, newest=False)
                if history:  # open never reads an older baseline; verify checks each one
                    start = older[0]
                    assert isinstance(start, SessionStart)  # check_epoch guarantees it
                    load_baseline(self.dir_fd, baseline_path(self.directory, epoch), start.baseline)
                self._count(older_path, epoch, older, newest=False, end=closing)
                last = older[-1]
                assert isinstance(last, EpochEnd)  # check_epoch guarantees it
                closing = EpochEndAt(older_path, len(older), last)
                self.carry = last.summary
            self.sizes.append(newest_size)
            self._count(path, newest, records, newest=True, end=closing)
            if newest > 0 and first.key_index is not None:
                self.index = check_index_against_history(
                    self.dir_fd,
                    self.directory,
                    path,
                    first,
                    self.keys,
                    self.repeats,
                    read_files=index_files,
                )
        baseline = load_baseline(self.dir_fd, baseline_path(self.directory, newest), first.baseline)
        state = SessionState(
            session_id=self.session_id,
            directory=self.directory,
            epoch=newest,
            slot=first.slot,
            baseline=baseline,
            records=records,
            log_size=self.sizes[-1],
            carry=self.carry,
            prior_users=self.prior_users,
            prior_untrusted=self.prior_untrusted,
            max_call=self.max_call,
            keys=self.keys,
            repeats=self.repeats,
            key_index=self.index,
            epoch_sizes=self.sizes,
            first_read=first_read,
            next_call=max(self.next_call, self.max_call + 1),
            fence=self.fence,
            fence_known=self.fence_known,
            log_crc=self.crc,
            scan_summary=self.summary,
            kept_scan=self.kept,
        )
        last = records[-1]
        if isinstance(last, EpochEnd):
            # An epoch change cut short: its resume must carry what the EpochEnd binds.
            check_planned_digest(path, len(records), last, state)
        return state

    def _read(self, epoch: int, *, newest: bool) -> tuple[str, EpochRecords]:
        path = log_path(self.directory, epoch)
        if newest and self.newest_data is not None:
            data = self.newest_data
        else:
            data = read_file(self.dir_fd, os.path.basename(path), path)
        self.sizes.append(len(data))
        if not newest:
            self._check_sealed(path, data, epoch)
        # Each epoch names the session of the next (or the one it was forked from),
        # the newest the directory's: a fork's shared epochs name its origin.
        session_id = self.session_id
        if not newest:
            session_id = session_of_sealed(self.starts[epoch + 1], self.session_id)
        known = self.known if newest else None
        read = read_log(
            path, data, session_id, epoch, newest=newest, canonical=self.canonical, known=known
        )
        records = read.records
        self.scans[epoch] = (read.calls, read.users, read.keys)
        if newest:
            self.crc = read.crc
            if self.summarize and read.scan is not None:
                self.summary, self.kept = kept_after_open(read.scan, self.known, epoch, data)
        first = records[0]
        self.starts[epoch] = first if isinstance(first, SessionStart) else None
        return path, records

    def _check_sealed(self, path: str, data: bytes, epoch: int) -> None:
        """A sealed log must be the length and CRC-32 the next epoch's SessionStart recorded."""
        if epoch + 1 not in self.starts:
            self.starts[epoch + 1] = first_start(self.dir_fd, self.directory, epoch + 1)
        check_sealed(path, data, epoch, self.starts[epoch + 1])

    def _take_carried(self, path: str, first: SessionStart, epoch: int) -> None:
        """Take the state the newest SessionStart carries; its keys are the previous epoch's."""
        assert first.next_call is not None
        assert first.recent_keys is not None
        assert first.prior_users is not None
        assert first.prior_untrusted is not None
        self.next_call = first.next_call
        self.max_call = first.next_call - 1
        self.prior_users = first.prior_users
        self.prior_untrusted = first.prior_untrusted
        for key, line in parse_recent_keys(path, first.recent_keys).items():
            self.keys[key] = KeyRef(epoch - 1, line)
        self.fence_known = first.fence_token is not None
        if first.fence_token:
            # The older epochs' newest Owner, as if it were written in this epoch (a
            # SessionStart without the fence, written before, knows only this epoch's).
            self.fence = Fence(first.fence_token, first.fence_node or None)

    def _count(
        self,
        path: str,
        epoch: int,
        records: EpochRecords,
        *,
        newest: bool,
        end: EpochEndAt | None = None,
    ) -> None:
        """Check one epoch's calls and keys against what came before, and add them up.

        With ``end`` (the EpochEnd before, when the history is read) its carried state is
        checked against the older epochs' and the digest ``end`` recorded."""
        first = records[0]
        assert isinstance(first, SessionStart)
        if end is not None and first.carries_state:
            self._check_carried(path, first, epoch)
            check_carried_digest(path, first, end)
        if self.on_epoch is not None:
            self.on_epoch(records)
        self._fence(path, records)
        # What the scan (or the decode) read of the calls and keys, checked in a few
        # C-speed passes; the place of a problem is looked up only when there is one.
        calls, users, keys = self.scans.pop(epoch)
        floor = max(self.max_call + 1, self.next_call)
        if calls and (calls[0] < floor or calls != sorted(set(calls))):
            refuse_reused_call(path, records, floor)
        if calls:
            self.max_call = calls[-1]
        self._keys(path, epoch, users, keys, exact=first.key_index is not None)
        if not newest:
            self.prior_users += len(users)
            self.prior_untrusted += sum(
                u.untrusted for _n, u in records.of_type(User) if isinstance(u, User)
            )

    def _keys(
        self, path: str, epoch: int, users: list[int], keys: list[str | None], *, exact: bool
    ) -> None:
        """Refuse a key applied twice; index the keys of the epoch (``users``: their lines).

        Within the retry window of old (the same or adjacent epochs) a key was always applied
        once; from the first epoch whose SessionStart has a key index on, every key is
        (``exact``). One found again further back in a log written before keeps both places.
        """
        present = [key for key in keys if key is not None]
        if _all_new(self.keys, present) and not self.index.maybe_present(present):
            # The common case, in C-speed passes: no key seen before, none twice, none
            # whose hash a sealed epoch's index holds (zip reuses its pair: no tuples).
            places = compress(map(KeyRef, repeat(epoch), users), map(is_not, keys, repeat(None)))
            self.keys.update(zip(present, places, strict=True))
            return
        window = epoch - 1
        index = self.index
        for number, key in zip(users, keys, strict=True):
            if key is None:
                continue
            applied = self.keys.get(key)
            if applied is None and index.segments:
                found = index.find(key, self._confirm(key))
                applied = KeyRef(*found) if found is not None else None
            if applied is not None:
                if applied.epoch >= window or exact:
                    raise InvalidLog(
                        path,
                        number,
                        f"request key {quote(key, 80)} was already applied "
                        f"(epoch {applied.epoch}, line {applied.line}): a request is "
                        "applied once",
                    )
                self.repeats.append((key, applied))
            self.keys[key] = KeyRef(epoch, number)

    def _confirm(self, key: str) -> Callable[[int, int], bool]:
        def confirm(epoch: int, line: int) -> bool:
            return key_applied_at(self.dir_fd, log_path(self.directory, epoch), line, key)

        return confirm

    def _fence(self, path: str, records: EpochRecords) -> None:
        """Follow the Owner and Handoff records in order (store.fencing); InvalidLog if broken.

        After a Handoff every record is followed (nothing but a higher Owner may come).
        """
        if self.fence.sealed is not None or records.holds(Handoff):
            followed = list(enumerate(records, start=1))
        elif records.holds(Owner):
            followed = records.of_type(Owner)
        else:
            return
        for number, record in followed:
            if type(record) in (Owner, Handoff) or self.fence.sealed is not None:
                fenced = advance(self.fence, record)
                if isinstance(fenced, str):
                    raise InvalidLog(path, number, fenced)
                self.fence = fenced

    def _check_carried(self, path: str, first: SessionStart, epoch: int) -> None:
        """Check a SessionStart's carried state against the older epochs just read."""
        check_carried_fields(
            path,
            first,
            epoch,
            keys=self.keys,
            prior_users=self.prior_users,
            prior_untrusted=self.prior_untrusted,
            max_call=self.max_call,
            fence=self.fence,
        )
        assert first.next_call is not None  # checked above
        self.next_call = first.next_call


def _all_new(seen: dict[str, KeyRef], keys: Sequence[str | None]) -> bool:
    """True if no key in ``keys`` is in ``seen`` and none comes twice."""
    return len(set(keys)) == len(keys) and seen.keys().isdisjoint(keys)
