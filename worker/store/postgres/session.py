"""A session whose log is in PostgreSQL: the store's Session, its durable steps as transactions.

Everything but the durable steps is ``worker.store.session.Session``'s: the records,
their checks, the two-phase epoch commit, find_key, what memory learns and when. A group
commit is one fenced transaction; memory learns of it only once COMMIT returned. A
refused or failed write breaks the session (NotOwnerNow: another owner holds it; a lost
connection: the outcome is unknown), and the next open reads what the database holds.
"""

from __future__ import annotations

from typing import Final

from worker.store.baseline import Baseline
from worker.store.disk.files import Directory
from worker.store.epochs.carried_state import NextEpoch
from worker.store.epochs.epoch_commit import next_start
from worker.store.errors import NotOwnerNow, SessionBroken, SessionError
from worker.store.format.records import SessionStart
from worker.store.key_index import KeyIndex, stale_names
from worker.store.loader import SessionState, baseline_path
from worker.store.postgres.backend import PostgresBackend
from worker.store.postgres.errors import LostBeforeWrite
from worker.store.session import Session

# Session's descriptors stand for "open" here; nothing is ever done with them.
_NO_FD: Final = -1


class PostgresSession(Session):
    """An open session stored in PostgreSQL, written under its owner token."""

    def __init__(self, state: SessionState, backend: PostgresBackend) -> None:
        """Wrap a loaded session and the backend that holds it; use ``PostgresStore``."""
        super().__init__(state, _NO_FD, _NO_FD)
        self._backend: PostgresBackend | None = backend
        backend.holds = lambda: (self._state.epoch, self._size)  # checked on a new connection
        # What broke the session, for the worker's exit code (refused, or outcome unknown).
        self.broken_by: SessionError | None = None

    @property
    def broken(self) -> str | None:
        """Why appends are refused; also once a new connection found the database holding
        less than this writer wrote (``connection.check_held``): the worker then exits 8
        after its replies, and the session is opened again from what the database holds."""
        diverged = None if self._backend is None else self._backend.diverged
        if self._broken is None and diverged is not None:
            self._broken, self.broken_by = _why_broken(diverged), diverged
        return self._broken

    @property
    def backend(self) -> PostgresBackend:
        """The session's storage; SessionBroken once closed."""
        if self._backend is None:
            raise SessionBroken(self.log_path, "session is closed")
        return self._backend

    @property
    def token(self) -> int:
        """The owner token this session writes under."""
        return self.backend.token

    def files(self) -> Directory:
        return self.backend

    def _write_group(self, data: bytes) -> None:
        try:
            self.backend.append_group(self._state.epoch, self._size, data)
        except SessionError as exc:
            self._broken, self.broken_by = _why_broken(exc), exc
            raise

    def _write_next_epoch(
        self, plan: NextEpoch, baseline: Baseline
    ) -> tuple[SessionStart, bytes, int]:
        state = self._state
        start, line, crc = next_start(state, plan, baseline)
        files = {segment.name: segment.data() for segment in plan.new_segments}
        files[baseline_path("", state.epoch + 1)] = baseline.to_json()
        try:
            self.backend.start_epoch(state.epoch + 1, files, line)
        except SessionError as exc:
            self._broken, self.broken_by = _why_broken(exc), exc
            raise
        return start, line, crc

    def _remove_stale(self, index: KeyIndex) -> None:
        """After an epoch change committed: segments the new index no longer names. One
        not removed (the database away meanwhile) is harmless, as one a crash leaves, and
        removed at a later change: let go, never an error of the change that committed."""
        try:
            self.backend.remove(stale_names(self.backend.names(), index))
        except SessionError:
            return

    def _put_summary(self, blob: bytes) -> None:
        """In the database, beside the log (``PostgresBackend.put_summary``), where any
        node's open finds it: a failover's too, not only a restart on this node."""
        self.backend.put_summary(blob)

    def close(self) -> None:
        """Close the connection; idempotent (an uncommitted write was never acknowledged)."""
        self._lock_fd = self._log_fd = None
        backend, self._backend = self._backend, None
        if backend is not None:
            backend.close()


def _why_broken(exc: SessionError) -> str:
    if isinstance(exc, NotOwnerNow):
        return f"another owner holds the session: {exc.why}"
    if isinstance(exc, LostBeforeWrite):
        return exc.why  # nothing was sent: the outcome is known
    return f"a write's outcome is unknown: {exc}"
