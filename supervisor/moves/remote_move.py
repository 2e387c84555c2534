"""``loopd move`` between nodes that share nothing: the mover drives, the nodes act.

The same intent, fences and crash table as ``move.move_session`` (docs/scaling.md 6);
only who touches the disks differs. The mover (any host with an operator certificate)
writes the intent and makes the ownership transaction in etcd, and asks each node over
the transport for the steps on its disk: the source ``stop`` and ``seal``, the target
``pull`` (copy and verify), the target ``adopt`` (its ``Owner`` record, then serving),
the source ``release`` and ``forget``. Each node reads the move from etcd before it
acts, so a rerun after a kill anywhere finishes the move.
"""

from __future__ import annotations

from typing import Protocol

from supervisor.cluster.errors import ClusterError
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.etcd_types import Delete, value_is
from supervisor.cluster.keys import move_key
from supervisor.cluster.ownership import owner_of
from supervisor.moves.move import (
    MoveDone,
    MoveStep,
    StepHook,
    abort_in_etcd,
    start_intent,
    take_ownership,
)
from supervisor.moves.move_stored import node_is_stored


class NodeBusy(ClusterError):
    """A node answered ``busy``: a job of the session is in progress there; retry."""


class NodeCalls(Protocol):
    """One control request to a node, by its name (over TLS for a remote node)."""

    def __call__(self, node: str, op: str, session: str) -> object: ...


def move_remote(
    client: EtcdClient,
    session: str,
    target: str,
    call: NodeCalls,
    *,
    before_step: StepHook | None = None,
) -> MoveDone:
    """Move ``session`` to ``target`` (or finish a killed run's move); rerunnable."""
    hook = before_step or (lambda _step: None)
    hook(MoveStep.INTENT)
    intent = start_intent(client, session, target)
    if intent is None:  # already there
        owner = owner_of(client, session)
        return MoveDone(session=session, node=target, token=owner.token if owner else 0)
    owner = owner_of(client, session)
    stored = node_is_stored(client, intent.source)  # in a database: no file is copied
    if owner is None or owner.node != target:
        hook(MoveStep.SEAL)
        call(intent.source, "stop", session)
        if stored:
            hook(MoveStep.OWN)
            owner = take_ownership(client, intent, owner)
            call(intent.target, "adopt", session)
            call(intent.source, "forget", session)
            client.txn([value_is(move_key(session), intent.encode())],
                       [Delete(key=move_key(session))])  # fmt: skip
            return MoveDone(session=session, node=target, token=owner.token)
        call(intent.source, "seal", session)
        hook(MoveStep.COPY)
        call(intent.target, "pull", session)  # copies, checks each file, installs
        hook(MoveStep.OWN)
        owner = take_ownership(client, intent, owner)
    hook(MoveStep.OPEN)
    call(intent.target, "adopt", session)  # the target writes Owner{T'} and serves
    hook(MoveStep.RELEASE)
    call(intent.source, "release", session)
    call(intent.source, "forget", session)
    client.txn([value_is(move_key(session), intent.encode())], [Delete(key=move_key(session))])
    return MoveDone(session=session, node=target, token=owner.token)


def abort_remote(client: EtcdClient, session: str, call: NodeCalls) -> MoveDone:
    """Undo a move between hosts whose target does not own the session yet: the source
    owns it again under a new token and serves it (its ``Owner`` after its ``Handoff``);
    the target discards its copy, never served."""
    intent, token = abort_in_etcd(client, session)
    call(intent.source, "adopt", session)
    call(intent.target, "discard", session)
    call(intent.target, "forget", session)
    return MoveDone(session=session, node=intent.source, token=token)
