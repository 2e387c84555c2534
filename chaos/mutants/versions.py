"""A mutant of App versions: a new epoch names the App of the epoch it closes."""

from __future__ import annotations

import dataclasses

from worker.store.format.records import SessionStart
from worker.store.session_state import SessionState


def next_epoch_keeps_its_app() -> None:
    from worker.store.epochs import carried_state  # noqa: PLC0415 - patched in the child only

    start = carried_state.NextEpoch.start

    def keeping(
        self: carried_state.NextEpoch, state: SessionState, baseline_hash: str
    ) -> SessionStart:
        # The bug: the next epoch's SessionStart copies the closing one's App block
        # instead of naming the worker that writes it, so an epoch begun by a new
        # version still names the old one.
        made = start(self, state, baseline_hash)
        first = state.records[0]
        if not isinstance(first, SessionStart) or first.app is None:
            return made
        return dataclasses.replace(made, app=first.app, app_version=first.app_version)

    carried_state.NextEpoch.start = keeping  # type: ignore[method-assign]
