"""``loopd cordon NODE`` / ``uncordon``: no new session is placed on a cordoned node.

A cordon is a durable key (``/loopd/cordoned/<node>``, no lease: it outlives the node's
restarts), checked inside the placement transaction itself (``ownership.place_new``),
so a create racing a cordon either lands before it or is refused ``cordoned``. Sessions
already on the node stay and are served; ``loopd drain`` cordons first, then moves
them away, so a session created during or after a drain does not land on the drained
node.
"""

from __future__ import annotations

import time

from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import cordon_key, cordons_prefix, encode_value


def cordon(client: EtcdClient, node: str) -> None:
    """Cordon ``node`` (again: harmless)."""
    client.put(cordon_key(node), encode_value({"since": time.time()}))


def uncordon(client: EtcdClient, node: str) -> bool:
    """Lift the cordon of ``node``; False if it was not cordoned."""
    return client.delete(cordon_key(node)) > 0


def cordoned_nodes(client: EtcdClient) -> frozenset[str]:
    """Every cordoned node's name."""
    prefix = cordons_prefix()
    return frozenset(kv.key.removeprefix(prefix) for kv in client.range(prefix, prefix=True))
