"""``loopd drain NODE`` of the replicated sessions it holds a copy of (docs/scaling.md 9.5).

Each copy leaves only once another node holds one in sync: a session NODE owns gets a
new follower first (a live, uncordoned node holding no copy of it, in another zone
where it can), then is handed over to one of its in-sync followers, and NODE's copy
leaves; a session NODE follows gets a new follower, in sync, before NODE is taken out
of its replica set. A session for which no such node is there is refused in one line
naming it; the others go on.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from supervisor.cluster.cordon import cordoned_nodes
from supervisor.cluster.errors import ClusterError
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import PREFIX
from supervisor.cluster.move import MoveDone
from supervisor.cluster.ownership import owner_of
from supervisor.cluster.remote_move import NodeCalls
from supervisor.cluster.replica_grow import grow, shrink
from supervisor.cluster.replica_move import move_replicated
from supervisor.cluster.replica_placement import new_copy_node
from supervisor.cluster.replica_set import ReplicaSet, parse_replica_set
from supervisor.cluster.routing import live_nodes


@dataclass(slots=True)
class Drained:
    """What a drain of the replicated sessions did: moves made, sessions refused (one line each)."""

    moved: list[MoveDone] = field(default_factory=list)
    followed: list[tuple[str, str]] = field(default_factory=list)  # (session, new follower)
    refused: list[str] = field(default_factory=list)


def replica_sets(client: EtcdClient) -> dict[str, ReplicaSet]:
    """Every replicated session's replica set, by session."""
    prefix = f"{PREFIX}replicas/"
    return {
        kv.key.removeprefix(prefix): parse_replica_set(kv.value, kv.mod_revision)
        for kv in client.range(prefix, prefix=True)
    }


def drain_replicas(
    client: EtcdClient, node: str, owned: list[str], call: NodeCalls, *, sync_timeout: float = 30.0
) -> Drained:
    """Move every copy ``node`` holds of a replicated session (``owned``: those it owns,
    placed on it) to other nodes, one copy at a time. ``node`` is cordoned already."""
    done = Drained()
    sets = replica_sets(client)
    cordoned = cordoned_nodes(client) | {node}
    load = Counter({n: 0 for n in live_nodes(client)})
    for current in sets.values():
        load.update(current.followers)
    for session in sorted(owned):
        current = sets[session]
        try:
            targets = [f for f in current.in_sync if f not in cordoned]
            if not targets:
                raise ClusterError(f"session {session}: no in-sync follower outside the drained "
                                   f"and cordoned nodes to hand it over to (in sync: "
                                   f"{', '.join(current.in_sync) or 'none'})")  # fmt: skip
            target = min(targets, key=lambda t: (load[t], t))
            extra = _added_copy(current) if len(current.followers) >= current.replicas else (
                new_copy_node(client, session, node, current, cordoned))  # fmt: skip
            moved = move_replicated(client, session, target, call, add_first=extra,
                                    sync_timeout=sync_timeout)  # fmt: skip
        except ClusterError as exc:
            done.refused.append(str(exc))
        else:
            done.moved.append(moved)
            if extra is not None:
                load[extra] += 1
    for session, current in sorted(sets.items()):
        if node not in current.followers:
            continue
        try:
            owner = owner_of(client, session)
            holder = owner.node if owner is not None else node
            extra = new_copy_node(client, session, holder, current, cordoned)
            grow(client, session, extra, call, timeout=sync_timeout)
            shrink(client, session, node, call)
        except ClusterError as exc:
            done.refused.append(str(exc))
        else:
            done.followed.append((session, extra))
            load[extra] += 1
    return done


def _added_copy(current: ReplicaSet) -> str | None:
    """A session with a copy more than it asks for (a killed drain's grow): none is added;
    the follower not in sync yet, if one is, is caught up first (then the owner's leaves)."""
    behind = [f for f in current.followers if f not in current.in_sync]
    return behind[0] if behind else None
