"""``loopd move`` of a replicated session: one replica at a time (docs/scaling.md 9.5).

The owner goes to ``target``. If ``target`` is not an in-sync follower it is first
added as one (``replica_grow``: placed in etcd under the owner's token, caught up by
the owner's worker, in the in-sync set), so the session has one copy more than it asks
for, and the old owner's copy leaves at the end. Then the planned handover:

1. ``intent``: ``/loopd/moves/<id>`` written (the owner's token compared, the target in
   the in-sync set): no failover, no other move, and no re-promotion on the old owner
   while it is there;
2. ``stop``: the owner's worker ends; everything it acknowledged is on the target;
3. ``demote``: the old owner's whole copy becomes a follower's copy (``replicas/``);
4. ``own``: one transaction: the owner's token (or its absence), the move key, the
   replica set's revision with the target in sync; the target owns the session (its
   lease, a higher token), the placement follows, the old owner becomes an in-sync
   follower (its copy holds every acknowledged write; out of sync if it could not be
   demoted, or out of the set if a copy was added); the move key is replaced by
   ``/loopd/moved/<id>``, which blocks nothing: from here on a failover may happen;
5. ``release``: the old owner stops listing the session (and, if a copy was added,
   sets its copy aside);
6. ``promote``: the target promotes its copy and serves it (``Owner{target, T'}``; its
   failover watch does the same within a third of the TTL if the mover is gone);
7. ``done``: ``/loopd/moved/<id>`` deleted.

A rerun reads both keys and goes on from what etcd shows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import time
from collections.abc import Callable

from supervisor.cluster.errors import ClusterError, MoveFailed
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.etcd_types import Compare, Delete, Put, absent, modified_at, value_is
from supervisor.cluster.keys import PREFIX, move_key, node_value, owner_key, placement_key
from supervisor.cluster.move import MoveDone, MoveIntent, abort_in_etcd, node_home
from supervisor.cluster.ownership import OwnerRecord, owner_of, placement_of
from supervisor.cluster.remote_move import NodeBusy, NodeCalls
from supervisor.cluster.replica_grow import grow
from supervisor.cluster.replica_set import ReplicaSet, replicas_key, replicas_of
from worker.store.session_id import validate_session_id


class ReplicaStep(enum.Enum):
    """The steps of a replicated move, in order; a kill hook runs before each."""

    GROW = "grow"
    INTENT = "intent"
    STOP = "stop"
    DEMOTE = "demote"
    OWN = "own"
    RELEASE = "release"
    PROMOTE = "promote"
    DONE = "done"


ReplicaHook = Callable[[ReplicaStep], None]


def moved_key(session: str) -> str:
    """``/loopd/moved/<id>``: a handover made in etcd whose nodes' steps may be left."""
    return f"{PREFIX}moved/{validate_session_id(session)}"


def move_replicated(
    client: EtcdClient,
    session: str,
    target: str,
    call: NodeCalls,
    *,
    before_step: ReplicaHook | None = None,
    sync_timeout: float = 30.0,
    add_first: str | None = None,
) -> MoveDone:
    """Make ``target`` the owner of the replicated ``session``; rerunnable after a kill.

    ``target`` not an in-sync follower: it is added first and the old owner's copy
    leaves at the end. ``add_first`` (a drain): that node is added as a follower first
    and the old owner's copy leaves, ``target`` being an in-sync follower already."""
    hook = before_step or (lambda _step: None)
    _finish(client, session, call, hook, sync_timeout)  # an earlier run's steps left
    intent = _intent_of(client, session)
    if intent is not None and intent.target != target:
        raise MoveFailed(session, "intent", f"a move to {intent.target} is in progress: rerun "
                         f"with --to {intent.target}")  # fmt: skip
    owner = owner_of(client, session)
    if intent is None:
        if owner is not None and owner.node == target and placement_of(client, session) == target:
            return MoveDone(session=session, node=target, token=owner.token)
        current = _replica_set(client, session)
        drop = False
        if target not in current.in_sync:
            hook(ReplicaStep.GROW)
            drop = grow(client, session, target, call, timeout=sync_timeout)
        elif add_first is not None:
            hook(ReplicaStep.GROW)
            drop = grow(client, session, add_first, call, timeout=sync_timeout)
        if len(_replica_set(client, session).followers) >= current.replicas:
            drop = (
                True  # a copy more than it asks for (an earlier run's grow): the old owner's leaves
            )
        hook(ReplicaStep.INTENT)
        intent = _start(client, session, target, drop)
        owner = owner_of(client, session)
    hook(ReplicaStep.STOP)
    reachable = True
    try:
        if owner is not None:
            call(intent.source, "stop", session)
        hook(ReplicaStep.DEMOTE)
        if not intent.drop_source:
            call(intent.source, "demote", session)
    except ClusterError:
        if owner is not None and owner.node == intent.source and _answers(call, intent.source):
            raise  # it answers but refused: nothing is handed over (a rerun tries again)
        reachable = False  # its node is gone: its copy cannot be kept in sync
        if owner is not None:  # ... provably: its lease expires (its worker may still run)
            _lease_expired(client, intent, sync_timeout)
            owner = None
    hook(ReplicaStep.OWN)
    token = hand_over(client, intent, owner, kept_in_sync=reachable)
    _finish(client, session, call, hook, sync_timeout)
    return MoveDone(session=session, node=target, token=token)


def abort_replicated(
    client: EtcdClient, session: str, call: NodeCalls, *, timeout: float = 30.0
) -> MoveDone:
    """``loopd move ID --abort`` of a replicated handover not owned by its target yet: the
    old owner owns it again under a new token (the move key gone), promotes its copy back
    if it was demoted, and serves it; the target stays an in-sync follower."""
    intent, token = abort_in_etcd(client, session)
    _patiently(call, intent.source, "promote", session, timeout)
    _patiently(call, intent.source, "adopt", session, timeout)
    return MoveDone(session=session, node=intent.source, token=token)


def _answers(call: NodeCalls, node: str) -> bool:
    try:
        call(node, "ping", "-")
    except ClusterError:
        return False
    return True


def _lease_expired(client: EtcdClient, intent: MoveIntent, timeout: float) -> None:
    """None once the old owner's lease has expired (its node is gone: nobody owns the
    session, the move key keeps a failover away); MoveFailed if it still holds it after
    ``timeout`` seconds: a node the mover cannot reach may be serving it still."""
    deadline = time.monotonic() + timeout
    while (owner := owner_of(client, intent.session)) is not None:
        if owner.node != intent.source or owner.token != intent.token:
            raise MoveFailed(intent.session, "stop", f"{owner.node} owns it now: rerun")
        if time.monotonic() > deadline:
            why = "still owns it in etcd (its lease has not expired): nothing was handed over"
            raise MoveFailed(intent.session, "stop", f"{intent.source} did not answer and {why}"
                             "; rerun once it answers, or loopd move --abort")  # fmt: skip
        time.sleep(0.1)


def _finish(
    client: EtcdClient, session: str, call: NodeCalls, hook: ReplicaHook, timeout: float
) -> None:
    """The nodes' steps after the handover's transaction (``/loopd/moved/<id>``)."""
    kv = client.get(moved_key(session))
    if kv is None:
        return
    done = MoveIntent.decode(session, kv.value)
    hook(ReplicaStep.RELEASE)
    # The old owner: its copy a follower's (demoted again if that failed before the
    # transaction), or set aside if a copy was added; then it stops listing the session.
    # Unreachable, it does the same when it returns (placed elsewhere: quarantined).
    with contextlib.suppress(ClusterError):
        call(done.source, "unfollow" if done.drop_source else "demote", session)
        call(done.source, "forget", session)
    owner = owner_of(client, session)
    if owner is not None and owner.node == done.target:
        hook(ReplicaStep.PROMOTE)
        try:
            _patiently(call, done.target, "promote", session, timeout)
            _patiently(call, done.target, "adopt", session, timeout)
        except ClusterError:
            if owner_of(client, session) == owner:
                raise  # still the target's under this token: a rerun promotes it again
            # its lease expired meanwhile (a loaded machine): the token moved on, as below
    # else the token moved on (a failover, or the target's lease expired): the target
    # owns the session no more and is not promoted; its owner, if any, serves its own copy.
    hook(ReplicaStep.DONE)
    client.txn([value_is(moved_key(session), kv.value)], [Delete(key=moved_key(session))])


def _patiently(call: NodeCalls, node: str, op: str, session: str, timeout: float) -> None:
    """``call``, again while the node answers ``busy`` (its failover watch may be
    promoting and claiming the same session), for at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            call(node, op, session)
        except NodeBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
        else:
            return


def _replica_set(client: EtcdClient, session: str) -> ReplicaSet:
    current = replicas_of(client, session)
    if current is None:
        raise MoveFailed(session, "intent", "it has no replica set: not a replicated session")
    return current


def _intent_of(client: EtcdClient, session: str) -> MoveIntent | None:
    kv = client.get(move_key(session))
    if kv is None:
        return None
    intent = MoveIntent.decode(session, kv.value)
    if not intent.replicated:
        raise MoveFailed(session, "intent", f"a move of its files to {intent.target} is in "
                         "progress: finish or abort it first")  # fmt: skip
    return intent


def _start(client: EtcdClient, session: str, target: str, drop: bool) -> MoveIntent:
    """Step 1: the move key, written while ``target`` is an in-sync follower of the owner."""
    owner = owner_of(client, session)
    placed = placement_of(client, session)
    if owner is None or placed != owner.node:
        holder = owner.node if owner else "nobody"
        raise MoveFailed(session, "intent", f"placed on {placed}, owned by {holder}: a move "
                         "needs a live owner")  # fmt: skip
    current = _replica_set(client, session)
    if target not in current.in_sync:
        raise MoveFailed(session, "intent", f"{target} is not in its in-sync set "
                         f"{list(current.in_sync)}: nothing was changed")  # fmt: skip
    source_home, _lease = node_home(client, owner.node)
    target_home, _lease = node_home(client, target)
    intent = MoveIntent(session=session, source=owner.node, target=target, token=owner.token,
                        source_home=source_home, target_home=target_home, replicated=True,
                        drop_source=drop)  # fmt: skip
    written = client.txn(
        [
            modified_at(owner_key(session), owner.token),
            value_is(placement_key(session), node_value(owner.node)),
            modified_at(replicas_key(session), current.revision),
            absent(move_key(session)),
        ],
        [Put(key=move_key(session), value=intent.encode())],
    )
    if not written.succeeded:
        raise MoveFailed(session, "intent", "its owner or replica set changed meanwhile: rerun")
    return intent


def hand_over(
    client: EtcdClient, intent: MoveIntent, owner: OwnerRecord | None, *, kept_in_sync: bool
) -> int:
    """Step 4: the target, an in-sync follower, owns the session; the old owner follows it
    in sync (its demoted copy holds every acknowledged write), or out of sync if it could
    not be demoted, or not at all if a copy was added for it. The new token."""
    session, source, target = intent.session, intent.source, intent.target
    _home, lease = node_home(client, target)
    current = _replica_set(client, session)
    if target not in current.in_sync:
        raise MoveFailed(session, "own", f"{target} left the in-sync set {list(current.in_sync)}"
                         ": abort the move (loopd move --abort) or rerun it")  # fmt: skip
    kept = () if intent.drop_source else (source,)
    followers = tuple(f for f in current.followers if f != target) + kept
    in_sync = tuple(f for f in current.in_sync if f != target) + (kept if kept_in_sync else ())
    lost = 0 if kept_in_sync or intent.drop_source else 1  # the old owner's node is gone
    if len(in_sync) + lost < min(len(current.in_sync), current.replicas - 1):
        raise MoveFailed(session, "own", f"{1 + len(in_sync)} of its {current.replicas} copies "
                         "would be in sync after it, fewer than now: rerun later")  # fmt: skip
    addresses = current.addresses if kept else tuple(a for a in current.addresses
                                                     if a[0] != source)  # fmt: skip
    wanted = dataclasses.replace(
        current, followers=followers, in_sync=in_sync, addresses=addresses, revision=0
    )
    # The old owner holds the token the move started from, or its lease expired after
    # its worker stopped: either way nobody else owned the session since.
    fence: Compare = (
        modified_at(owner_key(session), intent.token) if owner else absent(owner_key(session))
    )
    result = client.txn(
        [
            fence,
            value_is(move_key(session), intent.encode()),
            modified_at(replicas_key(session), current.revision),
        ],
        [
            Put(key=owner_key(session), value=node_value(target), lease=lease),
            Put(key=placement_key(session), value=node_value(target)),
            Put(key=replicas_key(session), value=wanted.value()),
            Delete(key=move_key(session)),
            Put(key=moved_key(session), value=intent.encode()),
        ],
    )
    if not result.succeeded:
        raise MoveFailed(session, "own", "the owner or the replica set changed during the "
                         "move: rerun it")  # fmt: skip
    return result.revision
