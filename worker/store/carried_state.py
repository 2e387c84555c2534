"""The state an epoch commit carries forward in the next SessionStart, both ways.

Written by ``Session.commit_epoch`` and read back by the loader, so that open reads the
newest epoch alone (docs/format.md, "State carried forward at the epoch commit").
"""

from __future__ import annotations

import json

from worker.store.errors import InvalidLog
from worker.store.records import SessionStart, User
from worker.store.session_state import SessionState


def next_epoch_start(state: SessionState, baseline_hash: str, next_call: int) -> SessionStart:
    """The SessionStart of the epoch after ``state``'s, carrying what open needs of it.

    ``recent_keys`` holds the request keys applied in the closing epoch with their
    lines: with the new epoch's own, the retry window.
    """
    users = [r for r in state.records if isinstance(r, User)]
    recent = {k: ref.line for k, ref in state.keys.items() if ref.epoch == state.epoch}
    return SessionStart(
        session=state.session_id,
        epoch=state.epoch + 1,
        slot=state.slot,
        baseline=baseline_hash,
        next_call=next_call,
        prior_users=state.prior_users + len(users),
        prior_untrusted=state.prior_untrusted + sum(u.untrusted for u in users),
        recent_keys=json.dumps(recent, ensure_ascii=False, separators=(",", ":")),
    )


def parse_recent_keys(path: str, text: str) -> dict[str, int]:
    """Parse SessionStart.recent_keys: a JSON object of request key -> line (InvalidLog)."""
    try:
        keys = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidLog(path, 1, f"SessionStart.recent_keys is not JSON: {exc}") from exc
    if type(keys) is not dict or not all(type(line) is int and line >= 1 for line in keys.values()):
        raise InvalidLog(
            path, 1, "SessionStart.recent_keys must be a JSON object of request key -> line"
        )
    return keys
