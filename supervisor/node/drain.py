"""``loopd drain NODE``: move every session placed on a node to the other live nodes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from supervisor.cluster.errors import MoveFailed
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import node_of, placements_prefix
from supervisor.cluster.routing import live_nodes
from supervisor.moves.move import MoveDone, SessionControl, move_session
from supervisor.node.cordon import cordon, cordoned_nodes


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
) -> list[MoveDone]:
    """Cordon ``node``, then move each of its sessions to the live, uncordoned node holding
    the fewest; the moves made. The cordon stays (``loopd uncordon`` lifts it)."""
    targets = sorted(set(live_nodes(client)) - {node} - cordoned_nodes(client))
    if not targets:
        raise MoveFailed("-", "drain", f"no other live node, not cordoned, to move the "
                         f"sessions of {node} to")  # fmt: skip
    cordon(client, node)  # first: a session created from here on lands elsewhere
    done: list[MoveDone] = []
    placed = placements(client)
    load = Counter({target: 0 for target in targets})
    load.update(n for n in placed.values() if n in load)
    for session in sorted(s for s, n in placed.items() if n == node):
        target = min(targets, key=lambda t: (load[t], t))
        if mover is not None:  # between hosts: remote_move.move_remote
            done.append(mover(session, target))
        else:
            done.append(move_session(client, session, target, control=control))
        load[target] += 1
    return done
