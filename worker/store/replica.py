"""A follower's copy of a session: the owner's log, applied step by step (docs/scaling.md).

The copy lives in a home of its own, ``<root>/sessions/<id>`` (a node keeps its
followers' copies in ``<home>/replicas``, out of the way of the sessions it owns), so
``Session.open(root, id)`` and ``load_session`` open it as any other session: after
every applied step it is a valid session holding a prefix of the owner's log.

Every step is checked whole before a byte of it is written (``replica_chunk``): it
must continue the copy's chain where it ends and carry a fencing token no lower than
the highest the copy has seen. The highest token is the log's (its ``Owner`` records,
the fence carried by its ``SessionStart``) or a higher one a step carried, kept in
``<root>/fences/<id>`` (written and fsynced before the step that raised it is written).
A step is acknowledged (``apply`` returns) only after ``fdatasync``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import zlib
from types import TracebackType
from typing import Final

from worker.store import durable
from worker.store.baseline import Baseline, hash_bytes
from worker.store.carried_state import plan_next_epoch
from worker.store.creation import make_opened_durable, sync_parents
from worker.store.epoch_commit import switch_to_next_epoch
from worker.store.epoch_log import key_applied_at
from worker.store.errors import SessionExists, SessionIOError, TornLog
from worker.store.files import read_file
from worker.store.key_index import remove_stale, write_segments
from worker.store.layout import ensure_sessions_dir, lock_existing, session_dir
from worker.store.loader import SessionState, load_session
from worker.store.lock import unlock_directory
from worker.store.records import EpochEnd
from worker.store.repair import RepairResult, repair_torn_tail
from worker.store.replica_chunk import check_chunk
from worker.store.replica_fences import raise_fence, read_fence
from worker.store.replica_start import check_first_line, describe_difference
from worker.store.replica_types import NotContinuing, Position, ReplicaRefused, StaleToken, Step
from worker.store.session_state import baseline_path, log_path

_EXISTS: Final = frozenset({errno.EEXIST})


class Replica:
    """A follower's copy, locked and open; ``apply`` writes the owner's steps to it."""

    def __init__(self, root: str, state: SessionState, lock_fd: int, log_fd: int) -> None:
        """Wrap a locked, loaded copy; use ``open`` or ``create``."""
        self._root = root
        self._state = state
        self._lock_fd: int | None = lock_fd
        self._log_fd: int | None = log_fd
        try:
            self._seen = max(state.fence.token, read_fence(root, state.session_id))
        except BaseException:  # a fence file that cannot be read: the copy stays closed
            durable.close(log_fd)
            unlock_directory(lock_fd)
            raise
        self._broken: str | None = None
        self.repaired: RepairResult | None = None  # a torn tail open moved to quarantine

    # -- construction -------------------------------------------------------------------

    @classmethod
    def open(cls, root: str | os.PathLike[str], session_id: str) -> Replica:
        """Open the copy; a torn last group (a kill while a step was written) is quarantined.

        That group was never acknowledged by this copy (``apply`` returns after the
        fdatasync), so its bytes go to ``<root>/quarantine/<id>/`` (never deleted) and the
        copy ends at the step before it; every other problem is refused as by open.
        """
        root = os.fspath(root)
        try:
            return cls._open(root, session_id)
        except TornLog:
            repaired = repair_torn_tail(root, session_id)
        replica = cls._open(root, session_id)
        replica.repaired = repaired
        return replica

    @classmethod
    def _open(cls, root: str, session_id: str) -> Replica:
        directory = session_dir(root, session_id)
        lock_fd = lock_existing(directory)
        try:
            state = load_session(directory, session_id, dir_fd=lock_fd)
            log_fd = durable.open_append(log_path(directory, state.epoch))
        except BaseException:
            unlock_directory(lock_fd)
            raise
        try:
            make_opened_durable(state, log_fd)
        except BaseException:
            durable.close(log_fd)
            unlock_directory(lock_fd)
            raise
        return cls(root, state, lock_fd, log_fd)

    @classmethod
    def create(cls, root: str | os.PathLike[str], step: Step) -> Replica:
        """Make a new copy from the session's epoch 0 step; SessionExists if one is there.

        A copy directory without any log is a create cut short (nothing in it was ever
        acknowledged): it is written afresh.
        """
        root = os.fspath(root)
        directory = session_dir(root, step.session)
        if step.epoch != 0 or step.baseline is None:
            raise NotContinuing(directory, f"no copy here: {step.describe()} needs one")
        start = check_first_line(directory, step)
        baseline = _parse_baseline(directory, step.baseline)
        ensure_sessions_dir(os.path.dirname(directory))
        try:
            durable.mkdir(directory)
        except SessionIOError as exc:
            if exc.errno not in _EXISTS:
                raise
        sync_parents(directory)
        lock_fd = lock_existing(directory)
        try:
            if any(name.endswith(".jsonl") for name in os.listdir(lock_fd)):
                raise SessionExists(directory)
            raise_fence(root, step.session, step.token)
            durable.write_file_atomic(baseline_path(directory, 0), step.baseline)
            durable.write_file_atomic(log_path(directory, 0), step.data)
            log_fd = durable.open_append(log_path(directory, 0))
        except BaseException:
            unlock_directory(lock_fd)
            raise
        state = SessionState(
            session_id=step.session,
            directory=directory,
            epoch=0,
            slot=start.slot,
            baseline=baseline,
            records=[start],
            log_size=len(step.data),
            carry=None,
            log_crc=_crc_after(step.data),
        )
        return cls(root, state, lock_fd, log_fd)

    # -- attributes ---------------------------------------------------------------------

    @property
    def id(self) -> str:
        """The session id."""
        return self._state.session_id

    @property
    def dir(self) -> str:
        """The copy's session directory."""
        return self._state.directory

    @property
    def position(self) -> Position:
        """Where the copy's newest log ends: what the owner's catch-up continues from."""
        state = self._state
        return Position(state.epoch, state.log_size, state.log_crc)

    @property
    def highest_token(self) -> int:
        """The highest fencing token the copy has seen (its log's or a step's)."""
        return self._seen

    # -- applying -----------------------------------------------------------------------

    def apply(self, step: Step) -> Position:
        """Check ``step`` whole, write it, fdatasync; return the copy's new position.

        Refused before a byte is written (ReplicaRefused, one line): another session's
        step, a token lower than the highest seen (StaleToken), a step that does not
        continue the copy where it ends (NotContinuing), lines that are not whole
        checksummed groups open would accept. A step the copy already holds byte for
        byte (a resend after a lost acknowledgement) changes nothing.
        """
        path = self._state.directory
        if self._log_fd is None or self._broken is not None:
            raise ReplicaRefused(path, f"the copy is {self._broken or 'closed'}")
        if step.session != self._state.session_id:
            raise ReplicaRefused(path, f"the step is of session {step.session!r}")
        if step.token < self._seen:
            raise StaleToken(
                path,
                f"{step.describe()} refused: token {step.token} is lower than {self._seen}, "
                "the highest this copy has seen (a deposed owner)",
            )
        # A higher token is a newer owner: from now on its predecessors are refused,
        # whether or not this step continues the copy.
        self._raise_seen(step.token)
        if self._holds(step):
            return self.position
        if step.is_epoch:
            self._apply_epoch(step)
        else:
            self._apply_lines(step)
        return self.position

    def _holds(self, step: Step) -> bool:
        """True if the copy already holds exactly ``step``'s bytes where it puts them."""
        state = self._state
        if step.is_epoch:
            return step.epoch <= state.epoch and self._holds_epoch(step)
        end = step.offset + len(step.data)
        if step.epoch > state.epoch or (step.epoch == state.epoch and end > state.log_size):
            return False
        assert self._lock_fd is not None
        # A resend of a sealed epoch's lines (its ack lost before the epoch step) is held
        # in that epoch's log, which never changes again.
        path = log_path(state.directory, step.epoch)
        if not os.path.lexists(path):
            return False
        data = read_file(self._lock_fd, os.path.basename(path), path)
        if step.offset >= len(data) or end > len(data):
            return False
        held = data[step.offset : end]
        return _crc_after(data[: step.offset]) == step.prior_crc and held == step.data

    def _holds_epoch(self, step: Step) -> bool:
        assert self._lock_fd is not None
        directory = self._state.directory
        log, base = log_path(directory, step.epoch), baseline_path(directory, step.epoch)
        first = read_file(self._lock_fd, os.path.basename(log), log)
        baseline = read_file(self._lock_fd, os.path.basename(base), base)
        return first[: len(step.data)] == step.data and baseline == step.baseline

    def _continues(self, step: Step) -> None:
        state = self._state
        at = (state.epoch, state.log_size, state.log_crc)
        if (step.epoch, step.offset, step.prior_crc) != at:
            raise NotContinuing(
                state.directory,
                f"{step.describe()} does not continue the copy, which ends at {self.position} "
                f"(the step follows CRC-32 {step.prior_crc:08x})",
            )

    def _apply_lines(self, step: Step) -> None:
        self._continues(step)
        state = self._state
        path = log_path(state.directory, state.epoch)
        chunk = check_chunk(state, path, step.data, self._applied_before)
        fd = self._log_fd
        assert fd is not None
        try:
            durable.write_all(fd, step.data, path)
            durable.fdatasync(fd, path)
        except SessionIOError as exc:
            self._broken = f"broken: writing {step.describe()} failed: {exc}"
            # Broken already: if the cut fails too, the next open reads what is on disk.
            with contextlib.suppress(SessionIOError):
                durable.truncate(fd, state.log_size, path)
            raise
        state.records.extend(chunk.records)
        state.log_size += len(step.data)
        state.log_crc = chunk.crc
        state.max_call = chunk.max_call
        state.next_call = max(state.next_call, chunk.max_call + 1)
        state.fence = chunk.fence
        state.keys.update(chunk.keys)
        self._seen = max(self._seen, chunk.fence.token)

    def _applied_before(self, key: str) -> bool:
        """True if ``key`` was applied in a sealed epoch the key index covers."""
        state = self._state
        lock_fd = self._lock_fd
        assert lock_fd is not None

        def confirm(epoch: int, line: int) -> bool:
            return key_applied_at(lock_fd, log_path(state.directory, epoch), line, key)

        return state.key_index.find(key, confirm) is not None

    def _apply_epoch(self, step: Step) -> None:
        state = self._state
        directory = state.directory
        last = state.records[-1]
        if not isinstance(last, EpochEnd) or step.epoch != state.epoch + 1:
            if step.epoch <= state.epoch:
                raise NotContinuing(
                    directory, f"{step.describe()}: the copy is at {self.position} already"
                )
            raise NotContinuing(
                directory,
                f"{step.describe()} does not continue the copy, which ends at {self.position}"
                + ("" if isinstance(last, EpochEnd) else " without EpochEnd"),
            )
        assert step.baseline is not None
        start = check_first_line(directory, step)
        baseline = _parse_baseline(directory, step.baseline)
        plan = plan_next_epoch(state)
        plan = plan.matching(last.carried) or plan
        expected = plan.start(state, hash_bytes(step.baseline))
        expected = dataclasses.replace(expected, time=start.time)
        if expected != start:
            raise ReplicaRefused(
                log_path(directory, step.epoch),
                "the SessionStart is not the one this copy's log leads to: "
                + describe_difference(expected, start),
            )
        write_segments(directory, plan.new_segments)
        durable.write_file_atomic(baseline_path(directory, step.epoch), step.baseline)
        new_log = log_path(directory, step.epoch)
        durable.write_file_atomic(new_log, step.data)
        new_fd = durable.open_append(new_log)
        old_fd, self._log_fd = self._log_fd, new_fd
        if old_fd is not None:
            durable.close(old_fd)
        switch_to_next_epoch(
            state, plan, start, baseline, last.summary, len(step.data), _crc_after(step.data)
        )
        assert self._lock_fd is not None
        remove_stale(self._lock_fd, directory, plan.index)

    def _raise_seen(self, token: int) -> None:
        if token > self._seen:
            raise_fence(self._root, self._state.session_id, token)
            self._seen = token

    # -- closing ------------------------------------------------------------------------

    def close(self) -> None:
        """Close the log and release the lock; idempotent."""
        log_fd, self._log_fd = self._log_fd, None
        lock_fd, self._lock_fd = self._lock_fd, None
        if log_fd is not None:
            durable.close(log_fd)
        if lock_fd is not None:
            unlock_directory(lock_fd)

    def __enter__(self) -> Replica:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Replica(id={self.id!r}, at {self.position})"


def _crc_after(data: bytes) -> int:
    return zlib.crc32(data)


def _parse_baseline(directory: str, data: bytes) -> Baseline:
    try:
        return Baseline.from_json(data)
    except ValueError as exc:
        raise ReplicaRefused(directory, f"the step's baseline is unparsable: {exc}") from exc
