"""Where a replicated session's followers are, and what its worker is told of them.

A new session with ``replicas`` N > 1 gets N-1 followers: live nodes other than the
owner, with a ``tls://`` address (followers are written over the cluster transport),
not cordoned, taken by name; where nodes name a zone (``loopd serve --zone``), each in
a zone none of the others (the owner's included) is in, while there are such zones
(then any). The worker of a replicated session is started with the followers' names
and addresses, the in-sync set etcd holds, and the node certificate
(``WorkerReplication.argv``, read by ``worker/replica_fence.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from supervisor.cluster.errors import ClusterError
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import cordons_prefix, decode_value, nodes_prefix
from supervisor.cluster.replica_set import ReplicaSet, replicas_of
from supervisor.cluster.routing import live_nodes
from supervisor.cluster.transport import TlsFiles
from supervisor.control_socket import socket_path


class ReplicasUnavailable(ClusterError):
    """A replicated session cannot be placed: too few nodes to follow it, or no TLS."""

    def __init__(self, session: str, why: str) -> None:
        super().__init__(session, why)
        self.session = session
        self.why = why

    def __str__(self) -> str:
        return f"session {self.session}: {self.why}"


@dataclass(frozen=True, slots=True)
class WorkerReplication:
    """What the worker of a replicated session is started with."""

    replicas: int
    followers: tuple[tuple[str, str], ...]  # (name, tls:// address; "" if not registered)
    in_sync: tuple[str, ...]
    tls: TlsFiles
    daemon_socket: str  # where the worker asks the daemon to change the in-sync set

    def argv(self) -> list[str]:
        args = ["--replicas", str(self.replicas), "--in-sync", ",".join(self.in_sync)]
        for name, address in self.followers:
            args += ["--follower", f"{name}={address}"]
        args += ["--node-tls", self.tls.ca, self.tls.cert, self.tls.key]
        return [*args, "--daemon-socket", self.daemon_socket]

    def with_in_sync(self, node: str, in_sync: bool) -> WorkerReplication:
        names = [n for n in self.in_sync if n != node] + ([node] if in_sync else [])
        return replace(self, in_sync=tuple(sorted(names)))


def same_followers(one: WorkerReplication | None, other: WorkerReplication | None) -> bool:
    """True if both name the same followers at the same addresses (in-sync sets aside)."""
    if one is None or other is None:
        return one is other
    return dict(one.followers) == dict(other.followers)


def node_zones(client: EtcdClient) -> dict[str, str]:
    """The zone each live node registered (``loopd serve --zone``); nodes without none."""
    zones = {}
    for kv in client.range(nodes_prefix(), prefix=True):
        zone = decode_value(kv.value).get("zone")
        if isinstance(zone, str) and zone:
            zones[kv.key.removeprefix(nodes_prefix())] = zone
    return zones


def spread(
    candidates: list[str], holders: list[str], zones: dict[str, str], count: int
) -> list[str]:
    """``count`` of ``candidates`` (in order): each in a zone no holder of a copy (``holders``,
    then the ones picked) is in, while there is one; then any, in order (too few zones)."""
    used = {zones[n] for n in holders if n in zones}
    picks: list[str] = []
    pool = list(candidates)
    while len(picks) < count and pool:
        fresh = [n for n in pool if n in zones and zones[n] not in used]
        choice = fresh[0] if fresh else pool[0]
        picks.append(choice)
        pool.remove(choice)
        if choice in zones:
            used.add(zones[choice])
    return picks


def _candidates(client: EtcdClient, exclude: set[str] | frozenset[str]) -> list[str]:
    """Live, uncordoned ``tls://`` nodes not in ``exclude``, by name."""
    cordoned = {kv.key.removeprefix(cordons_prefix()) for kv in
                client.range(cordons_prefix(), prefix=True)}  # fmt: skip
    return sorted(
        name for name, address in live_nodes(client).items()
        if name not in exclude and address.startswith("tls://") and name not in cordoned
    )  # fmt: skip


def choose_followers(client: EtcdClient, session: str, me: str, replicas: int) -> list[str]:
    """``replicas - 1`` live, uncordoned ``tls://`` nodes other than ``me``: in zones other
    than ``me``'s and each other's where nodes name zones and there are enough, else any
    (by name)."""
    candidates = _candidates(client, {me})
    if len(candidates) < replicas - 1:
        raise ReplicasUnavailable(
            session,
            f"{replicas} copies need {replicas - 1} other live nodes with a tls:// address "
            f"to follow it, and {len(candidates)} are there ({', '.join(candidates) or 'none'})",
        )
    return spread(candidates, [me], node_zones(client), replicas - 1)


def new_copy_node(
    client: EtcdClient, session: str, owner: str, current: ReplicaSet,
    leaving: set[str] | frozenset[str],
) -> str:  # fmt: skip
    """A node to hold one more copy of ``session`` in place of one in ``leaving``: live,
    uncordoned, with a ``tls://`` address, holding no copy of it, in a zone none of the
    copies that stay is in where there is one."""
    holders = [owner, *current.followers]
    candidates = _candidates(client, {*holders, *leaving})
    if not candidates:
        raise ReplicasUnavailable(
            session,
            f"its {current.replicas} copies need another live, uncordoned node with a tls:// "
            f"address to hold one in place of {', '.join(sorted(leaving))}'s, and none is "
            "there: it stays",
        )
    staying = [n for n in holders if n not in leaving]
    return spread(candidates, staying, node_zones(client), 1)[0]


def replication_of(
    client: EtcdClient, session: str, tls: TlsFiles | None, home: str
) -> WorkerReplication | None:
    """What the worker of ``session`` is told of its followers; None if it has none."""
    current = replicas_of(client, session)
    if current is None or current.replicas <= 1:
        return None
    if tls is None:
        raise ReplicasUnavailable(session, "a replicated session needs the node's --tls-* files")
    addresses = {**dict(current.addresses), **live_nodes(client)}
    followers = tuple((name, addresses.get(name, "")) for name in current.followers)
    in_sync = tuple(sorted(current.in_sync))
    return WorkerReplication(current.replicas, followers, in_sync, tls, socket_path(home))


def zones_cell(zones: dict[str, str], owner: str, current: ReplicaSet) -> str | None:
    """The zones of a session's copies (``zones``: ``node_zones``), the owner's first
    (``-``: a node naming none, or gone), ``(shared)`` after them when two copies share
    one; None if no node names any."""
    if not zones:
        return None
    found = [zones.get(node, "-") for node in (owner, *current.followers)]
    shared = len(set(found)) < len(found) or "-" in found
    return ",".join(found) + ("(shared)" if shared else "")
