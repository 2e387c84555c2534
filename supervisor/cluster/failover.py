"""Failover: an in-sync follower takes a session over when its owner's lease is gone.

One etcd transaction (docs/scaling.md, "Replication"): nobody owns the session (the
owner key vanished with its lease), the replica set is the one read (so the follower
is in the in-sync set *as etcd holds it now*), no move is in progress, and the files
are still placed where they were. It makes the follower the owner (under its lease)
and the placement, and rewrites the replica set: the old owner becomes a follower, out
of sync until it has quarantined its unacknowledged suffix and caught up. Its
revision is the new token, higher than every token before it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from supervisor.cluster.errors import NotOwner
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.etcd_types import Get, Put, absent, modified_at, value_is
from supervisor.cluster.keys import move_key, node_of, node_value, owner_key, placement_key
from supervisor.cluster.replica_set import ReplicaSet, parse_replica_set, replicas_key


@dataclass(frozen=True, slots=True)
class Failover:
    """A failover made: the new token, the node that owned the session before, the set now."""

    token: int
    previous: str
    replica_set: ReplicaSet


def take_over(client: EtcdClient, session: str, node: str, lease: int) -> Failover:
    """Make ``node``, an in-sync follower, the owner of ``session``; NotOwner (one line) if
    the session is owned, ``node`` is not in its in-sync set, a move is in progress, or
    any of it changed before the transaction (nothing is written then)."""
    owner = client.get(owner_key(session))
    if owner is not None:
        raise NotOwner(session, f"owned by {node_of(owner.value)} (token {owner.mod_revision})")
    kv = client.get(replicas_key(session))
    if kv is None:
        raise NotOwner(session, "it has no replica set: only a replicated session fails over")
    current = parse_replica_set(kv.value, kv.mod_revision)
    if node not in current.in_sync:
        raise NotOwner(session, f"{node} is not in its in-sync set {list(current.in_sync)}")
    placed = client.get(placement_key(session))
    if placed is None:
        raise NotOwner(session, "the session is placed nowhere")
    previous = node_of(placed.value)
    followers = [f for f in current.followers if f != node] + [previous]
    in_sync = [f for f in current.in_sync if f != node]
    wanted = ReplicaSet(current.replicas, tuple(followers), tuple(in_sync), 0, current.addresses)
    result = client.txn(
        [
            absent(owner_key(session)),
            modified_at(replicas_key(session), current.revision),
            absent(move_key(session)),
            value_is(placement_key(session), placed.value),
        ],
        [
            Put(key=owner_key(session), value=node_value(node), lease=lease),
            Put(key=placement_key(session), value=node_value(node)),
            Put(key=replicas_key(session), value=wanted.value()),
        ],
        [Get(key=owner_key(session))],
    )
    if not result.succeeded:
        owners = result.reads[0]
        if owners:
            holder = node_of(owners[0].value)
            raise NotOwner(session, f"owned by {holder} (token {owners[0].mod_revision})")
        raise NotOwner(session, "its replica set, placement or move changed meanwhile: retry")
    return Failover(
        result.revision, previous, dataclasses.replace(wanted, revision=result.revision)
    )
