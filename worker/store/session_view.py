"""What an open session shows of its state: read-only, the same on every backend."""

from __future__ import annotations

from collections.abc import Sequence

from worker.store.baseline import Baseline
from worker.store.fencing import Fence
from worker.store.format.records import EpochEnd, Record
from worker.store.format.records_view import RecordsView
from worker.store.session_state import SessionState


class SessionView:
    """The attributes of ``worker.store.session.Session`` that only read its state."""

    _state: SessionState

    @property
    def id(self) -> str:
        """The session id."""
        return self._state.session_id

    @property
    def dir(self) -> str:
        """The session directory ``<home>/sessions/<id>``."""
        return self._state.directory

    @property
    def epoch(self) -> int:
        """The current (newest) epoch number."""
        return self._state.epoch

    @property
    def slot(self) -> int:
        """The slot given at create; carried into every epoch."""
        return self._state.slot

    @property
    def baseline(self) -> Baseline:
        """The current epoch's baseline."""
        return self._state.baseline

    @property
    def records(self) -> Sequence[Record]:
        """The current epoch's records, SessionStart first (read-only)."""
        return RecordsView(self._state.records)

    @property
    def carry(self) -> str | None:
        """The previous epoch's EpochEnd summary; None in epoch 0."""
        return self._state.carry

    @property
    def prior_users(self) -> int:
        """How many User records the older epochs hold."""
        return self._state.prior_users

    @property
    def prior_untrusted(self) -> int:
        """How many untrusted User records the older epochs hold."""
        return self._state.prior_untrusted

    @property
    def fence(self) -> Fence:
        """The ownership the log records: newest token, its node, the sealing Handoff if any."""
        return self._state.fence

    @property
    def epoch_closed(self) -> bool:
        """True when the current epoch ends with EpochEnd (commit_epoch must follow)."""
        return isinstance(self._state.records[-1], EpochEnd)
