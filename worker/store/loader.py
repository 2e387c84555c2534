"""Read and validate a session directory without changing a byte of it.

``load_session`` is the whole of ``open``'s reading. A session whose newest
``SessionStart`` carries the state of the older epochs (next call, prior counters, the
previous epoch's request keys) is opened from its newest epoch alone, plus the last
line of the previous log (its ``EpochEnd``: the carry, and the chain between them).
A session written before that state was carried, or a reader asking for the history
(``loopd verify``, ``inspect --all``), reads every epoch and, where a ``SessionStart``
carries state, checks it against what the older epochs hold. Nothing is repaired: the
first problem is raised as TornLog, InvalidLog or BaselineError with its place.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable
from typing import Final

from worker.store.baseline import Baseline, hash_bytes
from worker.store.carried_state import parse_recent_keys
from worker.store.epoch_log import DecodedLog, check_epoch, check_groups, decode_log
from worker.store.errors import BaselineError, InvalidLog, SessionIOError, SessionNotFound, quote
from worker.store.fencing import NO_FENCE, advance
from worker.store.files import open_directory, read_file
from worker.store.records import (
    EpochEnd,
    Handoff,
    Owner,
    Record,
    SessionStart,
    ToolResult,
    User,
    decode_line,
)
from worker.store.session_state import KeyRef, SessionState, baseline_path, log_path

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

_LOG_NAME: Final = re.compile(r"(0|[1-9][0-9]*)\.jsonl")
_DIGITS_LOG: Final = re.compile(r"[0-9]+\.jsonl")
_MISSING: Final = frozenset({errno.ENOENT})
_FENCING: Final[frozenset[type[Record]]] = frozenset((Owner, Handoff))


def list_epochs(session_dir: str, dir_fd: int | None = None) -> list[int]:
    """Return the epoch numbers that have a log, ascending; refuse gaps and odd names."""
    try:
        names = os.listdir(session_dir if dir_fd is None else dir_fd)
    except OSError as exc:
        if exc.errno in _MISSING:
            raise SessionNotFound(session_dir) from exc
        raise SessionIOError(session_dir, exc.errno or 0, "list directory") from exc
    epochs = []
    for name in names:
        if _LOG_NAME.fullmatch(name):
            epochs.append(int(name[: -len(".jsonl")]))
        elif _DIGITS_LOG.fullmatch(name):
            raise InvalidLog(os.path.join(session_dir, name), 1, "epoch number has a leading zero")
    epochs.sort()
    if not epochs:
        raise SessionNotFound(session_dir)
    if epochs[0] != 0:
        raise InvalidLog(
            log_path(session_dir, epochs[0]), 1, "0.jsonl is missing: the log has no first epoch"
        )
    for expected, epoch in enumerate(epochs):
        if epoch != expected:
            raise InvalidLog(
                log_path(session_dir, epoch),
                1,
                f"gap in epochs: {expected}.jsonl is missing before {epoch}.jsonl",
            )
    return epochs


def load_baseline(dir_fd: int, path: str, expected_hash: str) -> Baseline:
    """Read, hash and parse a baseline; BaselineError if missing, unparsable or mismatched."""
    try:
        data = read_file(dir_fd, os.path.basename(path), path)
    except SessionIOError as exc:
        if exc.errno in _MISSING:
            raise BaselineError(path, "baseline file is missing") from exc
        raise
    actual = hash_bytes(data)
    if actual != expected_hash:
        raise BaselineError(
            path,
            f"baseline hashes to {actual}, SessionStart.baseline says {quote(expected_hash, 80)}",
        )
    try:
        return Baseline.from_json(data)
    except ValueError as exc:
        raise BaselineError(path, f"baseline is unparsable: {exc}") from exc


def load_session(
    session_dir: str,
    session_id: str,
    *,
    on_epoch: Callable[[list[Record]], None] | None = None,
    dir_fd: int | None = None,
    newest_data: bytes | None = None,
    history: bool = False,
) -> SessionState:
    """Read and check the session in ``session_dir``; change nothing.

    Files are read relative to ``dir_fd`` (the session directory's open fd, e.g. the
    one holding its lock), or to an fd of ``session_dir`` opened without following a
    link. ``on_epoch`` sees each epoch read, oldest first. With ``newest_data`` those
    bytes stand for the newest log's (repair checks a cut with it). With ``history``
    every epoch is read and every carried field checked against it.
    """
    if dir_fd is not None:
        return _Reader(session_dir, session_id, dir_fd, on_epoch, newest_data).load(history)
    own_fd = open_directory(session_dir)
    try:
        return _Reader(session_dir, session_id, own_fd, on_epoch, newest_data).load(history)
    finally:
        os.close(own_fd)


class _Reader:
    """One reading of a session: the epochs it reads and what they add up to."""

    def __init__(
        self,
        directory: str,
        session_id: str,
        dir_fd: int,
        on_epoch: Callable[[list[Record]], None] | None,
        newest_data: bytes | None,
    ) -> None:
        self.directory = directory
        self.session_id = session_id
        self.dir_fd = dir_fd
        self.on_epoch = on_epoch
        self.newest_data = newest_data
        self.sizes: list[int] = []
        self.keys: dict[str, KeyRef] = {}
        self.max_call = 0
        self.next_call = 1
        self.prior_users = self.prior_untrusted = 0
        self.carry: str | None = None
        self.fence = NO_FENCE

    def load(self, history: bool) -> SessionState:
        epochs = list_epochs(self.directory, self.dir_fd)
        newest = epochs[-1]
        path, records = self._read(newest, newest=True)
        first = records[0]
        assert isinstance(first, SessionStart)  # check_epoch guarantees it
        if newest > 0 and first.carries_state and not history:
            first_read = newest
            self._take_carried(path, first, newest)
            self.carry = self._previous_summary(newest)
            self._count(path, newest, records, newest=True, check_carried=False)
        else:
            first_read = 0
            newest_size = self.sizes.pop()
            for epoch in epochs[:-1]:
                older_path, older = self._read(epoch, newest=False)
                self._count(older_path, epoch, older, newest=False, check_carried=epoch > 0)
                last = older[-1]
                assert isinstance(last, EpochEnd)  # check_epoch guarantees it
                self.carry = last.summary
            self.sizes.append(newest_size)
            self._count(path, newest, records, newest=True, check_carried=newest > 0)
        baseline = load_baseline(self.dir_fd, baseline_path(self.directory, newest), first.baseline)
        return SessionState(
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
            epoch_sizes=self.sizes,
            first_read=first_read,
            next_call=max(self.next_call, self.max_call + 1),
            fence=self.fence,
        )

    def _read(self, epoch: int, *, newest: bool) -> tuple[str, list[Record]]:
        path = log_path(self.directory, epoch)
        if newest and self.newest_data is not None:
            data = self.newest_data
        else:
            data = read_file(self.dir_fd, os.path.basename(path), path)
        self.sizes.append(len(data))
        decoded = decode_log(path, data)
        check_epoch(path, self.session_id, epoch, decoded.records, newest=newest)
        check_groups(path, decoded.records, decoded.framed)
        return path, decoded.records

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

    def _previous_summary(self, epoch: int) -> str:
        """Read the previous log's last line: it must be the EpochEnd leading to ``epoch``."""
        path = log_path(self.directory, epoch - 1)
        data = read_file(self.dir_fd, os.path.basename(path), path)
        lines = data.count(b"\n")
        start = data.rfind(b"\n", 0, len(data) - 1) + 1
        try:
            last, _part = decode_line(data[start:-1]) if data.endswith(b"\n") else (None, None)
        except ValueError as exc:
            raise InvalidLog(path, lines, f"undecodable last record: {exc}") from exc
        if not isinstance(last, EpochEnd) or last.next != epoch:
            raise InvalidLog(
                path,
                max(lines, 1),
                f"epoch {epoch - 1} does not end with EpochEnd (the one leading to epoch {epoch})",
            )
        return last.summary

    def _count(
        self, path: str, epoch: int, records: list[Record], *, newest: bool, check_carried: bool
    ) -> None:
        """Check one epoch's calls and keys against what came before, and add them up."""
        first = records[0]
        assert isinstance(first, SessionStart)
        if check_carried and first.carries_state:
            self._check_carried(path, first, epoch)
        if self.on_epoch is not None:
            self.on_epoch(records)
        if self.fence.sealed is not None or any(type(r) in _FENCING for r in records):
            self._fence(path, records)
        window = epoch - 1  # keys of older epochs than this have left the retry window
        # Comprehensions over the types, not a Python branch per record: a large log's
        # calls and keys are checked in a few C-speed passes; the place of a problem is
        # looked up only when there is one.
        calls = [r.call for r in records if type(r) is ToolResult]
        floor = max(self.max_call + 1, self.next_call)
        if calls and (calls[0] < floor or calls != sorted(set(calls))):
            self._reused_call(path, records, floor)
        if calls:
            self.max_call = calls[-1]
        users = [(n, r) for n, r in enumerate(records, start=1) if type(r) is User]
        for number, user in users:
            assert isinstance(user, User)
            if user.key is not None:
                applied = self.keys.get(user.key)
                if applied is not None and applied.epoch >= window:
                    raise InvalidLog(
                        path,
                        number,
                        f"request key {quote(user.key, 80)} was already applied "
                        f"(epoch {applied.epoch}, line {applied.line}): a request is "
                        "applied once",
                    )
                self.keys[user.key] = KeyRef(epoch, number)
        if not newest:
            self.prior_users += len(users)
            self.prior_untrusted += sum(u.untrusted for _n, u in users)

    def _fence(self, path: str, records: list[Record]) -> None:
        """Follow the Owner and Handoff records in order (worker.fencing); InvalidLog if broken."""
        for number, record in enumerate(records, start=1):
            if type(record) in _FENCING or self.fence.sealed is not None:
                fenced = advance(self.fence, record)
                if isinstance(fenced, str):
                    raise InvalidLog(path, number, fenced)
                self.fence = fenced

    @staticmethod
    def _reused_call(path: str, records: list[Record], floor: int) -> None:
        """Raise InvalidLog at the first ToolResult whose call number is not new."""
        highest = floor - 1
        for number, record in enumerate(records, start=1):
            if isinstance(record, ToolResult):
                if record.call <= highest:
                    raise InvalidLog(
                        path,
                        number,
                        f"ToolResult.call {record.call} reuses a call number (the next free "
                        f"one is {highest + 1})",
                    )
                highest = record.call

    def _check_carried(self, path: str, first: SessionStart, epoch: int) -> None:
        """Check a SessionStart's carried state against the older epochs just read."""
        previous = {k: ref.line for k, ref in self.keys.items() if ref.epoch == epoch - 1}
        carried = parse_recent_keys(path, str(first.recent_keys))
        problems = [
            (first.prior_users, self.prior_users, "prior_users"),
            (first.prior_untrusted, self.prior_untrusted, "prior_untrusted"),
        ]
        for said, held, name in problems:
            if said != held:
                raise InvalidLog(
                    path, 1, f"SessionStart.{name} is {said}, the older epochs hold {held}"
                )
        if first.next_call is None or first.next_call <= self.max_call:
            raise InvalidLog(
                path,
                1,
                f"SessionStart.next_call is {first.next_call}, but call {self.max_call} "
                "was already used",
            )
        if carried != previous:
            raise InvalidLog(
                path,
                1,
                f"SessionStart.recent_keys does not match the request keys of epoch {epoch - 1}",
            )
        self.next_call = first.next_call
