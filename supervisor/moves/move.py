"""Moving a session between nodes: seal, copy, verify, own, open, release (docs/scaling.md 6).

Every step is rerunnable: the intent is written to etcd first (``/loopd/moves/<id>``),
each step checks whether it was already done, and the ownership change is one
transaction that compares the old owner's token. A kill anywhere leaves at most one
node able to write; ``move_session`` run again finishes the move, ``abort_move`` undoes
it while the target does not own the session yet.
"""

from __future__ import annotations

import enum
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from supervisor.cluster.errors import MoveFailed
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.etcd_types import Delete, Operation, Put, absent, modified_at, value_is
from supervisor.cluster.keys import (
    decode_value,
    encode_value,
    move_key,
    node_key,
    node_value,
    owner_key,
    placement_key,
)
from supervisor.cluster.ownership import OwnerRecord, owner_of, placement_of
from supervisor.moves.move_stored import node_is_stored
from supervisor.moves.session_files import (
    carry_tenant,
    copy_session,
    file_hashes,
    incoming_dir,
    install_copy,
    remove_released,
)
from worker import Handoff, Owner, Session, SessionLocked
from worker.store.disk.layout import session_dir


class MoveStep(enum.Enum):
    """The steps of a move, in order; a kill hook runs before each."""

    INTENT = "intent"
    SEAL = "seal"
    COPY = "copy"
    VERIFY = "verify"
    OWN = "own"
    OPEN = "open"
    RELEASE = "release"


class SessionControl(Protocol):
    """How the mover asks a node to stop or start serving a session (its worker)."""

    def stop(self, node: str, home: str, session: str) -> None:
        """Stop the session's worker on ``node`` so that its lock is free."""

    def start(self, node: str, home: str, session: str) -> None:
        """Start serving the session on ``node``."""

    def release(self, node: str, home: str, session: str) -> None:
        """Tell ``node`` that the session's files left it."""


class NoWorkers:
    """A SessionControl for nodes that run no worker (the files alone are moved)."""

    def stop(self, node: str, home: str, session: str) -> None:
        """Nothing to stop."""

    def start(self, node: str, home: str, session: str) -> None:
        """Nothing to start."""

    def release(self, node: str, home: str, session: str) -> None:
        """Nothing to forget."""


StepHook = Callable[[MoveStep], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class MoveIntent:
    """What ``/loopd/moves/<id>`` holds: the two nodes, their homes, the source's token."""

    session: str
    source: str
    target: str
    token: int
    source_home: str
    target_home: str

    def encode(self) -> bytes:
        value: dict[str, object] = {
            "from": self.source,
            "to": self.target,
            "token": self.token,
            "from_home": self.source_home,
            "to_home": self.target_home,
        }
        return encode_value(value)

    @classmethod
    def decode(cls, session: str, data: bytes) -> MoveIntent:
        value = decode_value(data)
        return cls(
            session=session,
            source=str(value["from"]),
            target=str(value["to"]),
            token=int(str(value["token"])),
            source_home=str(value["from_home"]),
            target_home=str(value["to_home"]),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class MoveDone:
    """A finished move: where the session is now and its new token."""

    session: str
    node: str
    token: int


def node_home(client: EtcdClient, node: str) -> tuple[str, int]:
    """Return a live node's home and lease; MoveFailed if it is not registered."""
    kv = client.get(node_key(node))
    if kv is None:
        raise MoveFailed("-", "intent", f"node {node} is not registered (is it running?)")
    home = decode_value(kv.value).get("home")
    if not isinstance(home, str):
        raise MoveFailed("-", "intent", f"node {node} registered no home")
    return home, kv.lease


def move_session(
    client: EtcdClient,
    session: str,
    target: str,
    *,
    control: SessionControl | None = None,
    before_step: StepHook | None = None,
) -> MoveDone:
    """Move ``session`` to ``target``, or finish the move a killed run left; rerunnable."""
    control = control or NoWorkers()
    hook = before_step or _no_hook
    hook(MoveStep.INTENT)
    intent = start_intent(client, session, target)
    if intent is None:  # already there
        owner = owner_of(client, session)
        return MoveDone(session=session, node=target, token=owner.token if owner else 0)
    owner = owner_of(client, session)
    if node_is_stored(client, intent.source):  # in a database: an ownership change only
        return _move_stored(client, intent, owner, control)
    if owner is None or owner.node != target:
        hook(MoveStep.SEAL)
        control.stop(intent.source, intent.source_home, session)
        seal_source(intent)
        hook(MoveStep.COPY)
        if not os.path.isdir(session_dir(intent.target_home, session)):
            copy_session(session_dir(intent.source_home, session), intent.target_home, session)
        hook(MoveStep.VERIFY)
        _verify_and_install(intent)
        hook(MoveStep.OWN)
        owner = take_ownership(client, intent, owner)
    hook(MoveStep.OPEN)
    _open_on_target(intent, owner)
    control.start(intent.target, intent.target_home, session)
    hook(MoveStep.RELEASE)
    remove_released(intent.source_home, session, f"moved-{owner.token}")
    control.release(intent.source, intent.source_home, session)
    client.txn([value_is(move_key(session), intent.encode())], [Delete(key=move_key(session))])
    return MoveDone(session=session, node=target, token=owner.token)


def _move_stored(
    client: EtcdClient, intent: MoveIntent, owner: OwnerRecord | None, control: SessionControl
) -> MoveDone:
    """``move_stored.hand_over`` through the daemons on this machine; the intent removed."""
    session, done = intent.session, owner
    if done is None or done.node != intent.target:
        control.stop(intent.source, intent.source_home, session)
        done = take_ownership(client, intent, owner)
    control.start(intent.target, intent.target_home, session)
    control.release(intent.source, intent.source_home, session)
    client.txn([value_is(move_key(session), intent.encode())], [Delete(key=move_key(session))])
    return MoveDone(session=session, node=intent.target, token=done.token)


def _no_hook(step: MoveStep) -> None:
    """No fault injection."""


def start_intent(client: EtcdClient, session: str, target: str) -> MoveIntent | None:
    """Return the move in progress, or write a new intent; None when already on ``target``."""
    existing = client.get(move_key(session))
    if existing is not None:
        intent = MoveIntent.decode(session, existing.value)
        if intent.target != target:
            raise MoveFailed(
                session,
                "intent",
                f"a move to {intent.target} is in progress: rerun with --to {intent.target} "
                "or abort it",
            )
        return intent
    placed = placement_of(client, session)
    if placed == target:
        return None
    owner = owner_of(client, session)
    if placed is None or owner is None or owner.node != placed:
        raise MoveFailed(
            session,
            "intent",
            f"placed on {placed}, owned by {owner.node if owner else 'nobody'}: a move needs "
            "a live owner holding the files",
        )
    source_home, _lease = node_home(client, placed)
    target_home, _lease = node_home(client, target)
    intent = MoveIntent(
        session=session,
        source=placed,
        target=target,
        token=owner.token,
        source_home=source_home,
        target_home=target_home,
    )
    written = client.txn(
        [
            modified_at(owner_key(session), owner.token),
            value_is(placement_key(session), node_value(placed)),
            absent(move_key(session)),
        ],
        [Put(key=move_key(session), value=intent.encode())],
    )
    if not written.succeeded:
        raise MoveFailed(session, "intent", "ownership changed while the move was starting")
    return intent


def seal_source(
    intent: MoveIntent, home: str | None = None, *, sealed: Callable[[], None] | None = None
) -> None:
    """Append ``Handoff{to, token}`` to the source log unless it already ends with it
    (``home``: the source's, when the source node seals its own copy); ``sealed`` runs
    once the log is sealed for this move, while the session is still open (locked)."""
    home = home or intent.source_home
    directory = session_dir(home, intent.session)
    if not os.path.isdir(directory):
        raise MoveFailed(intent.session, "seal", f"the source copy {directory} is missing")
    try:
        session = Session.open(home, intent.session)
    except SessionLocked as exc:
        raise MoveFailed(intent.session, "seal", f"the source session is in use: {exc}") from exc
    with session:
        fence = session.fence
        if fence.sealed is not None:
            if fence.sealed.to == intent.target and fence.sealed.token == intent.token:
                carry_tenant(home, intent.session)
                if sealed is not None:
                    sealed()
                return
            raise MoveFailed(intent.session, "seal", f"sealed for another move: {fence.sealed}")
        if fence.token > intent.token:
            raise MoveFailed(
                intent.session,
                "seal",
                f"the source log holds token {fence.token}, newer than the move's {intent.token}",
            )
        if fence.token < intent.token:
            # The owner holds intent.token in etcd (checked by the intent's transaction)
            # but its worker had not written it yet: write it for the owner, then seal.
            session.append(Owner(node=intent.source, token=intent.token))
        session.append(Handoff(to=intent.target, token=intent.token))
        # The tenant goes with the sealed files (before the seal's hashes are taken).
        carry_tenant(home, intent.session)
        if sealed is not None:
            sealed()


def _verify_and_install(intent: MoveIntent) -> None:
    """Check the copy's hashes against the source's, then install it as a session."""
    installed = session_dir(intent.target_home, intent.session)
    copy = (
        installed if os.path.isdir(installed) else incoming_dir(intent.target_home, intent.session)
    )
    expected = file_hashes(session_dir(intent.source_home, intent.session))
    found = file_hashes(copy)
    if found != expected:
        differ = sorted(
            name for name in found.keys() | expected.keys() if found.get(name) != expected.get(name)
        )
        raise MoveFailed(intent.session, "verify", f"the copy differs from the source in {differ}")
    if copy != installed:
        install_copy(intent.target_home, intent.session)


def take_ownership(
    client: EtcdClient, intent: MoveIntent, owner: OwnerRecord | None
) -> OwnerRecord:
    """One transaction: the target owns the session, placement follows; return the new owner."""
    _home, lease = node_home(client, intent.target)
    session = intent.session
    still_ours = value_is(move_key(session), intent.encode())
    writes: list[Operation] = [
        Put(key=owner_key(session), value=node_value(intent.target), lease=lease),
        Put(key=placement_key(session), value=node_value(intent.target)),
    ]
    # The old owner still holds the token the move started from, or its lease expired
    # (its node died after the seal): either way nobody else may have owned it since.
    fence = modified_at(owner_key(session), intent.token) if owner else absent(owner_key(session))
    result = client.txn([fence, still_ours], writes)
    if not result.succeeded:
        raise MoveFailed(session, "own", "the owner changed during the move; abort it")
    return OwnerRecord(node=intent.target, token=result.revision, lease=lease)


def _open_on_target(intent: MoveIntent, owner: OwnerRecord) -> None:
    """Append ``Owner{target, new token}`` to the target's copy, after the source's Handoff."""
    try:
        session = Session.open(intent.target_home, intent.session)
    except SessionLocked:
        return  # the target's worker already serves it, and writes its Owner itself
    with session:
        if session.fence.token < owner.token:
            session.append(Owner(node=intent.target, token=owner.token))


def abort_move(client: EtcdClient, session: str) -> MoveDone:
    """Undo a move whose target does not own the session yet: the source owns it again.

    The source gets a new, higher token (its log then reads ``Handoff`` followed by its
    own ``Owner``) and the target's copy, never served, is removed.
    """
    intent, result_revision = abort_in_etcd(client, session)
    try:
        opened = Session.open(intent.source_home, session)
    except SessionLocked:
        pass  # the source's worker serves it again and writes its Owner itself
    else:
        with opened:
            if opened.fence.token < result_revision:
                opened.append(Owner(node=intent.source, token=result_revision))
    for leftover in (
        incoming_dir(intent.target_home, session),
        session_dir(intent.target_home, session),
    ):
        if os.path.isdir(leftover):
            shutil.rmtree(leftover)
    return MoveDone(session=session, node=intent.source, token=result_revision)


def abort_in_etcd(client: EtcdClient, session: str) -> tuple[MoveIntent, int]:
    """An abort's transaction: the source owns the session again under a new token
    (returned with the intent), the move key is gone; MoveFailed if it cannot be undone."""
    existing = client.get(move_key(session))
    if existing is None:
        raise MoveFailed(session, "abort", "no move is in progress")
    intent = MoveIntent.decode(session, existing.value)
    owner = owner_of(client, session)
    if owner is not None and owner.node == intent.target:
        raise MoveFailed(session, "abort", f"{intent.target} owns it already: finish the move")
    _home, lease = node_home(client, intent.source)
    fence = modified_at(owner_key(session), intent.token) if owner else absent(owner_key(session))
    result = client.txn(
        [fence, value_is(move_key(session), intent.encode())],
        [
            Put(key=owner_key(session), value=node_value(intent.source), lease=lease),
            Delete(key=move_key(session)),
        ],
    )
    if not result.succeeded:
        raise MoveFailed(session, "abort", "the owner changed meanwhile")
    return intent, result.revision
