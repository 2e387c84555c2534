"""The state an epoch commit carries forward in the next SessionStart, both ways.

Written by ``Session.commit_epoch`` and read back by the loader, so that open reads the
newest epoch alone (docs/format.md, "State carried forward at the epoch commit").
Everything here is computed from what the logs hold, never from memory alone: a
resume after the ``EpochEnd`` computes the same next ``SessionStart`` as the writer
did, and the ``EpochEnd.carried`` digest of it binds the two.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace

from worker.store.errors import InvalidLog
from worker.store.format.dataclass_methods import Value
from worker.store.format.records import Owner, SessionStart, User
from worker.store.key_index import KeyIndex, Segment, entry
from worker.store.session_state import SessionState


@dataclass(frozen=True, slots=True, kw_only=True, repr=False, eq=False)
class NextEpoch(Value):
    """What the commit of an epoch carries into the next one, and the index files it writes."""

    next_call: int
    prior_users: int
    prior_untrusted: int
    recent_keys: str  # JSON object {key: line} of the closing epoch's keys
    index: KeyIndex  # of every epoch up to the closing one: ``key_index``
    new_segments: list[Segment]  # the files of ``index`` the commit writes
    # The fence (the newest Owner's token and node, 0 and "" when none); None in the
    # form of a commit begun by a loopd from before the fence was carried.
    fence_token: int | None
    fence_node: str | None

    @property
    def carried_fields(self) -> dict[str, object]:
        """The carried fields by name, in the order of ``SessionStart.carried_fields``."""
        fields: dict[str, object] = {
            "next_call": self.next_call,
            "prior_users": self.prior_users,
            "prior_untrusted": self.prior_untrusted,
            "recent_keys": self.recent_keys,
            "key_index": self.index.field(),
        }
        if self.fence_token is not None:
            fields["fence_token"] = self.fence_token
            fields["fence_node"] = self.fence_node
        return fields

    @property
    def digest(self) -> str:
        """``EpochEnd.carried``: the digest the next SessionStart's carried fields must have."""
        return carried_digest(self.carried_fields)

    def without_fence(self) -> NextEpoch:
        """The form an EpochEnd written before the fence was carried binds (no fence block)."""
        return replace(self, fence_token=None, fence_node=None)

    def matching(self, recorded: str | None) -> NextEpoch | None:
        """The form whose digest is ``recorded`` (an EpochEnd's), or None if neither's is.

        An EpochEnd that records no digest binds nothing: the current form is carried.
        """
        if recorded is None or recorded == self.digest:
            return self
        legacy = self.without_fence()
        return legacy if recorded == legacy.digest else None

    def start(self, state: SessionState, baseline_hash: str) -> SessionStart:
        """The SessionStart of the epoch after ``state``'s, carrying this."""
        return SessionStart(
            session=state.session_id,
            epoch=state.epoch + 1,
            slot=state.slot,
            baseline=baseline_hash,
            next_call=self.next_call,
            prior_users=self.prior_users,
            prior_untrusted=self.prior_untrusted,
            recent_keys=self.recent_keys,
            key_index=self.index.field(),
            prior_log_size=state.log_size,
            prior_log_crc=f"{state.log_crc:08x}",
            fence_token=self.fence_token,
            fence_node=self.fence_node,
        )


def carried_digest(carried: dict[str, object]) -> str:
    """SHA-256 (hex) of carried fields, as compact JSON in the writer's field order."""
    text = json.dumps(carried, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def plan_next_epoch(state: SessionState) -> NextEpoch:
    """The next epoch's carried state, computed from ``state`` as open learns it from the logs.

    ``next_call`` is the one open would compute (above every call in the log, and at
    least what the current SessionStart carries): a number ``next_call()`` handed out
    and never written is not carried, as a restart does not keep it either.
    ``recent_keys`` holds the closing epoch's keys with their lines, in line order; the
    index grows by every key of the epochs it does not cover yet. The fence is the one
    the log gives at its end; it is never sealed there (nothing, ``EpochEnd`` included,
    may follow a ``Handoff`` but a higher ``Owner``), so its token and node are all of it.
    """
    users = [r for _n, r in state.records.of_type(User) if isinstance(r, User)]
    # A fence read from a SessionStart written before the fence was carried knows only
    # this epoch's Owner records: it is carried (authoritative from then on) once an
    # Owner was written in this epoch, else the next SessionStart keeps the old form
    # rather than carry a token of 0 as if no older epoch had an owner.
    known = state.fence_known or state.records.holds(Owner)
    closing = sorted((ref.line, k) for k, ref in state.keys.items() if ref.epoch == state.epoch)
    covers = state.key_index.covers
    places = [*state.keys.items(), *state.repeats]
    entries = [entry(k, ref.epoch, ref.line) for k, ref in places if ref.epoch >= covers]
    index, new_segments = state.key_index.extended(state.epoch + 1, entries)
    return NextEpoch(
        next_call=max(state.next_call, state.max_call + 1),
        prior_users=state.prior_users + len(users),
        prior_untrusted=state.prior_untrusted + sum(u.untrusted for u in users),
        recent_keys=json.dumps(
            {k: line for line, k in closing}, ensure_ascii=False, separators=(",", ":")
        ),
        index=index,
        new_segments=new_segments,
        fence_token=state.fence.token if known else None,
        fence_node=(state.fence.node or "") if known else None,
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
