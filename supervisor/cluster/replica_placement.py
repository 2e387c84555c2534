"""Where a replicated session's followers are, and what its worker is told of them.

A new session with ``replicas`` N > 1 gets N-1 followers: live nodes other than the
owner, with a ``tls://`` address (followers are written over the cluster transport),
not cordoned, taken by name. The worker of a replicated session is started with the
followers' names and addresses, the in-sync set etcd holds, and the node certificate
(``WorkerReplication.argv``, read by ``worker/replica_fence.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from supervisor.cluster.errors import ClusterError
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import cordons_prefix
from supervisor.cluster.replica_set import replicas_of
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
    catch_up: tuple[str, ...] = ()  # followers out of sync to catch up at start (a move's)

    def argv(self) -> list[str]:
        args = ["--replicas", str(self.replicas), "--in-sync", ",".join(self.in_sync)]
        for name, address in self.followers:
            args += ["--follower", f"{name}={address}"]
        for name in self.catch_up:
            args += ["--catch-up", name]
        args += ["--node-tls", self.tls.ca, self.tls.cert, self.tls.key]
        return [*args, "--daemon-socket", self.daemon_socket]

    def with_in_sync(self, node: str, in_sync: bool) -> WorkerReplication:
        names = [n for n in self.in_sync if n != node] + ([node] if in_sync else [])
        return replace(self, in_sync=tuple(sorted(names)))


def choose_followers(client: EtcdClient, session: str, me: str, replicas: int) -> list[str]:
    """``replicas - 1`` live, uncordoned ``tls://`` nodes other than ``me``, by name."""
    cordoned = {kv.key.removeprefix(cordons_prefix()) for kv in
                client.range(cordons_prefix(), prefix=True)}  # fmt: skip
    candidates = sorted(
        name for name, address in live_nodes(client).items()
        if name != me and address.startswith("tls://") and name not in cordoned
    )  # fmt: skip
    if len(candidates) < replicas - 1:
        raise ReplicasUnavailable(
            session,
            f"{replicas} copies need {replicas - 1} other live nodes with a tls:// address "
            f"to follow it, and {len(candidates)} are there ({', '.join(candidates) or 'none'})",
        )
    return candidates[: replicas - 1]


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
