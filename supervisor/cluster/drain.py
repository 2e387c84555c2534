"""``loopd drain NODE``: move every session placed on a node to the other live nodes, and
every copy it holds of a replicated session (``replica_drain``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from supervisor.cluster.cordon import cordon, cordoned_nodes
from supervisor.cluster.errors import MoveFailed
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import node_of, placements_prefix
from supervisor.cluster.move import MoveDone, SessionControl, move_session
from supervisor.cluster.remote_move import NodeCalls
from supervisor.cluster.replica_drain import Drained, drain_replicas, replica_sets
from supervisor.cluster.routing import live_nodes


def placements(client: EtcdClient) -> dict[str, str]:
    """Every placed session and the node holding it."""
    prefix = placements_prefix()
    return {
        kv.key.removeprefix(prefix): node_of(kv.value) for kv in client.range(prefix, prefix=True)
    }


def least_loaded_node(client: EtcdClient, exclude: frozenset[str] = frozenset()) -> str:
    """The live, uncordoned node holding the fewest sessions (ties by name): where a new
    session goes."""
    candidates = sorted(set(live_nodes(client)) - exclude - cordoned_nodes(client))
    if not candidates:
        raise MoveFailed("-", "place", "no live node that is not cordoned")
    load = Counter({node: 0 for node in candidates})
    load.update(n for n in placements(client).values() if n in load)
    return min(candidates, key=lambda n: (load[n], n))


def drain_node(
    client: EtcdClient,
    node: str,
    *,
    control: SessionControl | None = None,
    mover: Callable[[str, str], MoveDone] | None = None,
    calls: NodeCalls | None = None,
) -> Drained:
    """Cordon ``node``, then move each of its sessions to the live, uncordoned node holding
    the fewest, and (with ``calls``, between hosts) every copy it holds of a replicated
    session one copy at a time (``replica_drain``). The cordon stays (``loopd uncordon``
    lifts it)."""
    targets = sorted(set(live_nodes(client)) - {node} - cordoned_nodes(client))
    if not targets:
        raise MoveFailed("-", "drain", f"no other live node, not cordoned, to move the "
                         f"sessions of {node} to")  # fmt: skip
    cordon(client, node)  # first: a session created from here on lands elsewhere
    done = Drained()
    placed = placements(client)
    load = Counter({target: 0 for target in targets})
    load.update(n for n in placed.values() if n in load)
    replicated = set(replica_sets(client))
    mine = sorted(s for s, n in placed.items() if n == node)
    for session in mine:
        if session in replicated:
            continue  # below, one copy at a time
        target = min(targets, key=lambda t: (load[t], t))
        if mover is not None:  # between hosts: remote_move.move_remote
            done.moved.append(mover(session, target))
        else:
            done.moved.append(move_session(client, session, target, control=control))
        load[target] += 1
    if calls is not None:
        drained = drain_replicas(client, node, [s for s in mine if s in replicated], calls)
        done.moved += drained.moved
        done.followed += drained.followed
        done.refused += drained.refused
    elif replicated:
        done.refused += [f"session {s}: a replicated session is drained between tls:// nodes "
                         "only" for s in mine if s in replicated]  # fmt: skip
        followed = sorted(s for s, c in replica_sets(client).items() if node in c.followers)
        done.refused += [f"session {s}: its copy on {node} stays (a replicated session's copies "
                         f"are moved between tls:// nodes only, and {node} is not registered at "
                         f"one): loopd move {s} --follower {node} --to NODE"
                         for s in followed]  # fmt: skip
    return done
