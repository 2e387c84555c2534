"""One copy more: a new follower of a replicated session, in sync before anything leaves.

``grow`` places the node as a follower in etcd (one transaction under the owner's
token and the replica set's revision), out of sync; the owner's daemon reads the set
again and restarts the session's worker, which catches the new follower up from
nothing between its batches, a slice at a time while it takes writes
(``worker.catch_up``), and adds it to the in-sync set in etcd once its copy ends at the
owner's position. The mover waits for that, reading etcd, for as long as the copy
grows (the owner's status reports where it ends: ``copy_at``), and gives up after
``timeout`` seconds without progress. Until it is in sync the new copy counts for
nothing: no failover may promote it, and no copy leaves.

``shrink`` takes a follower out (the set first, under the owner's token; then the
owner's worker restarts without it; then the node discards its copy).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

from supervisor.cluster.errors import ClusterError, MoveFailed
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.etcd_types import Put, absent, modified_at
from supervisor.cluster.keys import check_node_name, move_key, owner_key
from supervisor.cluster.ownership import owner_of
from supervisor.cluster.remote_move import NodeCalls
from supervisor.cluster.replica_set import ReplicaSet, replicas_key, replicas_of
from supervisor.cluster.routing import live_nodes

POLL: float = 0.05
PROGRESS_POLL: float = 1.0  # seconds between two reads of the owner's status


def grow(client: EtcdClient, session: str, node: str, call: NodeCalls, *, timeout: float) -> bool:
    """Make ``node`` an in-sync follower of ``session``; True if it was added here (False:
    it was a follower already, now back in sync). MoveFailed (one line) otherwise."""
    check_node_name(node)
    owner = owner_of(client, session)
    current = replicas_of(client, session)
    if owner is None or current is None:
        raise MoveFailed(session, "grow", "it has no live owner with a replica set")
    if owner.node == node:
        raise MoveFailed(session, "grow", f"{node} owns it: not a follower")
    added = node not in current.followers
    if added:
        address = live_nodes(client).get(node)
        if address is None or not address.startswith("tls://"):
            raise MoveFailed(session, "grow", f"{node} is not a live node with a tls:// address "
                             f"(found {address}): a follower is written over TLS")  # fmt: skip
        addresses = {**dict(current.addresses), node: address}
        wanted = dataclasses.replace(
            current, followers=(*current.followers, node),
            addresses=tuple(sorted(addresses.items())), revision=0,
        )  # fmt: skip
        _write(client, session, owner.token, current, wanted, "grow")
    call(owner.node, "refollow", session)  # its worker restarts and catches the node up
    deadline = time.monotonic() + timeout
    seen: object = None
    asked = 0.0
    while True:
        now = replicas_of(client, session)
        if now is not None and node in now.in_sync:
            return added
        if time.monotonic() >= asked + PROGRESS_POLL:  # a large copy: on while it grows
            asked = time.monotonic()
            at = copy_at(call, owner.node, session, node)
            if at is not None and at != seen:
                seen, deadline = at, time.monotonic() + timeout
        if time.monotonic() > deadline:
            why = (f"{node} is a follower but its copy did not grow for {timeout:g} s "
                   f"(out of sync, its copy at {seen})")  # fmt: skip
            raise MoveFailed(session, "grow", f"{why}; nothing else changed: rerun")
        time.sleep(POLL)


def copy_at(call: NodeCalls, owner: str, session: str, node: str) -> object:
    """Where ``node``'s copy ended at its last acknowledged catch-up piece, as the owner's
    status reports it (``worker.replication.Shipper.report``); None if not known."""
    try:
        status = call(owner, "status", session)
    except ClusterError:
        return None
    found = status[0] if isinstance(status, list) and status else None  # [its status]
    rows = found.get("lag") if isinstance(found, dict) else None
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and row.get("node") == node:
            return row.get("copy_at")
    return None


def shrink(client: EtcdClient, session: str, node: str, call: NodeCalls) -> ReplicaSet:
    """Take the follower ``node`` out of ``session``'s replica set; the set as written.

    Refused while that would leave fewer followers than the session asks for, or fewer
    in sync than are in sync now without it."""
    owner = owner_of(client, session)
    current = replicas_of(client, session)
    if owner is None or current is None or node not in current.followers:
        raise MoveFailed(session, "shrink", f"{node} is not one of its followers")
    followers = tuple(f for f in current.followers if f != node)
    if len(followers) < current.replicas - 1:
        raise MoveFailed(session, "shrink", f"without {node} it would keep {len(followers)} "
                         f"followers, and it asks for {current.replicas - 1}")  # fmt: skip
    in_sync = tuple(f for f in current.in_sync if f != node)
    if 1 + len(in_sync) < min(1 + len(current.in_sync), current.replicas):
        raise MoveFailed(session, "shrink", f"without {node} only {1 + len(in_sync)} of its "
                         f"{current.replicas} copies would be in sync")  # fmt: skip
    addresses = tuple((n, a) for n, a in current.addresses if n != node)
    wanted = dataclasses.replace(
        current, followers=followers, in_sync=in_sync, addresses=addresses, revision=0
    )
    written = _write(client, session, owner.token, current, wanted, "shrink")
    finish_shrink(client, session, node, call)
    return written


def finish_shrink(client: EtcdClient, session: str, node: str, call: NodeCalls) -> None:
    """The steps after shrink's transaction (again on a rerun: a mover killed after it
    left the owner's worker counting ``node``): the owner's worker restarted with the
    followers etcd lists, then ``node``'s copy set aside."""
    owner = owner_of(client, session)
    if owner is not None:
        call(owner.node, "refollow", session)  # its worker ships to the others only
    # Unreachable: its copy stays in its replicas/, never promoted (it follows no more).
    with contextlib.suppress(ClusterError):
        call(node, "unfollow", session)


def move_follower(
    client: EtcdClient, session: str, source: str, target: str, call: NodeCalls, *,
    timeout: float = 30.0,
) -> ReplicaSet:  # fmt: skip
    """``loopd move ID --follower FROM --to NODE``: NODE added and in sync, then FROM out;
    rerunnable (a rerun after FROM left finds NODE in sync and changes nothing)."""
    current = replicas_of(client, session)
    if current is None:
        raise MoveFailed(session, "grow", "it has no replica set: not a replicated session")
    if source not in current.followers:
        if target in current.in_sync:  # done in etcd: maybe killed after shrink's txn
            finish_shrink(client, session, source, call)
            return current
        raise MoveFailed(session, "grow", f"{source} is not one of its followers "
                         f"({', '.join(current.followers)})")  # fmt: skip
    grow(client, session, target, call, timeout=timeout)
    return shrink(client, session, source, call)


def _write(
    client: EtcdClient, session: str, token: int, current: ReplicaSet, wanted: ReplicaSet,
    step: str,
) -> ReplicaSet:  # fmt: skip
    result = client.txn(
        [
            modified_at(owner_key(session), token),
            modified_at(replicas_key(session), current.revision),
            absent(move_key(session)),
        ],
        [Put(key=replicas_key(session), value=wanted.value())],
    )
    if not result.succeeded:
        raise MoveFailed(session, step, "its owner, replica set or a move changed meanwhile: "
                         "nothing was changed; rerun")  # fmt: skip
    return dataclasses.replace(wanted, revision=result.revision)
