"""What open and ``verify`` check of the state an epoch commit carried forward.

Open trusts the newest SessionStart's carried fields only as far as it can check them
cheaply: their digest must be the one the EpochEnd before it recorded (the last line of
the previous log, which open reads anyway), and the key index files must hash as the
SessionStart says. ``verify`` (a reading of the history) checks the same, and every
carried field against what the older epochs hold, and rebuilds the key index from the
logs. Each problem is InvalidLog at the line that is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.store.disk.files import Directory
from worker.store.epochs.carried_state import carried_digest, parse_recent_keys, plan_next_epoch
from worker.store.errors import InvalidLog, quote
from worker.store.fencing import Fence
from worker.store.format.dataclass_methods import Value
from worker.store.format.records import EpochEnd, SessionStart
from worker.store.key_index import KeyIndex, entry, load_index, parse_field
from worker.store.session_state import KeyRef, SessionState


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class EpochEndAt(Value):
    """An epoch's closing EpochEnd and its place."""

    path: str
    line: int
    record: EpochEnd


def check_carried_digest(path: str, first: SessionStart, end: EpochEndAt) -> None:
    """The carried fields of ``first`` must hash to what the EpochEnd before it recorded.

    A SessionStart that carries nothing is read with the whole history (nothing of it
    is trusted), and an EpochEnd written before the digest existed binds nothing.
    """
    recorded = end.record.carried
    if recorded is None or not first.carries_state:
        return
    actual = carried_digest(first.carried_fields)
    if actual != recorded:
        raise InvalidLog(
            path,
            1,
            f"SessionStart's carried state hashes to {actual}, but the epoch commit "
            f"recorded {recorded} (EpochEnd.carried, {end.path}:{end.line}): a carried "
            "field is not what the commit carried",
        )


def check_planned_digest(path: str, line: int, end: EpochEnd, state: SessionState) -> None:
    """An EpochEnd not yet followed by its epoch: resume will carry what it recorded."""
    planned = plan_next_epoch(state)
    if planned.matching(end.carried) is None:
        raise InvalidLog(
            path,
            line,
            f"EpochEnd.carried is {quote(end.carried, 80)}, but the epoch's records give "
            f"{planned.digest}: the log changed after its EpochEnd was written",
        )


def check_carried_fields(
    path: str,
    first: SessionStart,
    epoch: int,
    *,
    keys: dict[str, KeyRef],
    prior_users: int,
    prior_untrusted: int,
    max_call: int,
    fence: Fence,
) -> None:
    """Check a SessionStart's carried state against the older epochs just read."""
    previous = {k: ref.line for k, ref in keys.items() if ref.epoch == epoch - 1}
    carried = parse_recent_keys(path, str(first.recent_keys))
    for said, held, name in [
        (first.prior_users, prior_users, "prior_users"),
        (first.prior_untrusted, prior_untrusted, "prior_untrusted"),
    ]:
        if said != held:
            why = f"SessionStart.{name} is {said}, the older epochs hold {held}"
            raise InvalidLog(path, 1, why)
    if first.next_call is None or first.next_call <= max_call:
        raise InvalidLog(
            path,
            1,
            f"SessionStart.next_call is {first.next_call}, but call {max_call} was already used",
        )
    if carried != previous:
        raise InvalidLog(
            path,
            1,
            f"SessionStart.recent_keys does not match the request keys of epoch {epoch - 1}",
        )
    if first.key_index is not None:
        parse_field(path, epoch, first.key_index)
    held_fence = (fence.token, fence.node or "")
    if first.fence_token is not None and (first.fence_token, first.fence_node) != held_fence:
        raise InvalidLog(
            path,
            1,
            f"SessionStart carries the fence token {first.fence_token} of "
            f"{quote(first.fence_node, 80)}, the older epochs hold {held_fence[0]} of "
            f"{quote(held_fence[1], 80)}",
        )


def check_index_against_history(
    dir_fd: Directory,
    directory: str,
    path: str,
    first: SessionStart,
    keys: dict[str, KeyRef],
    repeats: list[tuple[str, KeyRef]],
    *,
    read_files: bool = True,
) -> KeyIndex:
    """Rebuild the newest epoch's key index from the logs; it and its files must match.

    Without ``read_files`` the files are not read: the rebuilt index is returned (what
    ``loopd repair`` writes when a file is missing or damaged).
    """
    assert first.key_index is not None
    epochs = first.epoch
    places = [*keys.items(), *repeats]
    entries = [entry(k, ref.epoch, ref.line) for k, ref in places if ref.epoch < epochs]
    rebuilt, _new = KeyIndex().extended(epochs, entries)
    if rebuilt.field() != first.key_index:
        raise InvalidLog(
            path,
            1,
            f"SessionStart.key_index does not match the request keys of epochs 0-{epochs - 1}: "
            f"the logs give {quote(rebuilt.field(), 120)}",
        )
    if not read_files:
        return rebuilt
    return load_index(dir_fd, directory, path, epochs, first.key_index)
