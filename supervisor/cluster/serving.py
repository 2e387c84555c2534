"""``loopd serve --cluster URL --node NAME``: what the daemon asks of the cluster.

At start the daemon registers the node and claims the sessions on its disk (quarantining
copies it may no longer serve) before it hosts any; each worker is then started with its
session's token and the node's lease (``WorkerCluster``). A new session is placed and
owned in etcd before its worker creates it. Every etcd call ends by ``CALL_TIMEOUT`` in
all (``gateway_http``); those of ``place`` and ``claim`` are made in a thread of the
daemon (``supervisor/daemon/cluster_jobs.py``), never in its loop.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Final

from supervisor.cluster.errors import NotOwner
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import check_zone_name
from supervisor.cluster.lease import LeaseTiming, NodeNameTaken
from supervisor.cluster.move_node import discard_here, pull_here, release_here, seal_here
from supervisor.cluster.node import LEASE_FILE, Claims, ClusterNode
from supervisor.cluster.ownership import place_or_resume, unplace
from supervisor.cluster.receive_copy import install_here, receive_here
from supervisor.cluster.replica_move_node import demote_here, promote_here, unfollow_here
from supervisor.cluster.replica_placement import (
    ReplicasUnavailable,
    WorkerReplication,
    choose_followers,
    replication_of,
    same_followers,
)
from supervisor.cluster.replica_set import change_in_sync, place_replicas, replicas_of
from supervisor.cluster.routing import live_nodes
from supervisor.cluster.transport import TlsFiles, TransportError
from supervisor.errors import ServeError

CALL_TIMEOUT: Final = 2.0
REPLICA_STEPS: Final = frozenset({"demote", "promote", "refollow", "unfollow"})
NAME_RETRY: Final = 0.2
"""Seconds between attempts to register a name still held by a former lease."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerCluster:
    """What a cluster worker is started with: its node, token, lease and the lease file."""

    node: str
    token: int
    lease: int
    lease_file: str
    replication: WorkerReplication | None = None  # a replicated session's followers
    tls: TlsFiles | None = None
    """The node's certificate (``--listen``): the worker makes the handshake of each TCP
    connection the node's TLS thread hands it (docs/scaling.md, "How the port is served")."""

    def argv(self) -> list[str]:
        more = self.replication.argv() if self.replication is not None else []
        argv = [
            "--cluster-node", self.node, "--cluster-token", str(self.token),
            "--cluster-lease", str(self.lease), "--lease-file", self.lease_file, *more,
        ]  # fmt: skip
        if self.tls is not None:  # absolute: an App's worker may run in another directory
            for flag, path in (("--tls-ca", self.tls.ca), ("--tls-cert", self.tls.cert),
                               ("--tls-key", self.tls.key)):  # fmt: skip
                argv += [flag, os.path.abspath(path)]
        return argv


class ServingNode:
    """The cluster side of one ``loopd serve``."""

    def __init__(
        self,
        url: str,
        name: str,
        home: str,
        *,
        ttl: int | None = None,
        address: str | None = None,
        tls: TlsFiles | None = None,
        zone: str | None = None,
        store: str | None = None,
    ) -> None:
        if zone is not None:
            try:
                check_zone_name(zone)
            except ValueError as exc:
                raise ServeError(f"--zone: {exc}") from exc
        try:
            context = tls.etcd_context() if tls is not None else None
            self.client = EtcdClient(url, timeout=CALL_TIMEOUT, tls=context)
        except (ValueError, TransportError) as exc:
            raise ServeError(f"--cluster {url}: {exc}") from exc
        self.home = home
        self.tls = tls  # the node's certificate: it pulls moved sessions with it
        self.address = address
        timing = LeaseTiming(ttl=ttl) if ttl is not None else None
        self.node = ClusterNode(
            self.client, name, home, timing=timing, address=address, zone=zone, stored=bool(store)
        )
        self.lease_file = os.path.join(home, LEASE_FILE)
        self.replication: dict[str, WorkerReplication] = {}  # read in threads, never the loop
        self._in_sync_lock = threading.Lock()

    def start(self) -> list[str]:
        """Register and claim; return the sessions this node serves now.

        A node restarted after a crash finds its name still held by its former lease:
        it waits for that lease to expire (at most one TTL) rather than fail.
        """
        deadline = time.monotonic() + self.node.lease.timing.ttl + 2
        while True:
            try:
                claims = self.node.start()
            except NodeNameTaken:
                if time.monotonic() > deadline:
                    raise
                time.sleep(NAME_RETRY)
            else:
                for session in claims.served:
                    self._read_replication(session)
                return sorted(claims.served)

    def worker_args(self, session: str) -> WorkerCluster | None:
        """The cluster arguments of ``session``'s worker; None if this node does not own it."""
        held = self.node.held(session)
        if held is None:
            return None
        token, lease = held
        return WorkerCluster(
            node=self.node.name, token=token, lease=lease, lease_file=self.lease_file,
            replication=self.replication.get(session),
            tls=self.tls if self.address is not None else None,
        )  # fmt: skip

    def _read_replication(self, session: str) -> None:
        found = replication_of(self.client, session, self.tls, self.home)
        if found is None:
            self.replication.pop(session, None)
        else:
            self.replication[session] = found

    def change_in_sync(self, session: str, node: str, in_sync: bool) -> None:
        """A follower out of (or back in) the session's in-sync set, as its worker saw it:
        etcd's changed under the token this node owns it with (docs/scaling.md)."""
        held = self.node.held(session)
        if held is None:
            raise NotOwner(session, "not owned here")
        with self._in_sync_lock:
            if in_sync:
                change_in_sync(self.client, session, held[0], add=node)
            else:
                change_in_sync(self.client, session, held[0], remove=node)
            current = self.replication.get(session)
            if current is not None:
                self.replication[session] = current.with_in_sync(node, in_sync)

    def place(self, session: str, replicas: int = 1) -> WorkerCluster:
        """Place and own a new session on this node, which holds no files of it.

        AlreadyPlaced if it exists on any node; NotOwner if the node's lease changed
        meanwhile; any other ClusterError if etcd did not answer in time or answered
        badly: then nothing was placed, or a placement was made whose reply was lost,
        which a retry on this node takes up (``place_or_resume``).
        """
        lease = self.node.lease.lease_id
        followers = []
        if replicas > 1:
            if self.tls is None:
                raise ReplicasUnavailable(session, "--replicas needs nodes serving TLS (--listen)")
            followers = choose_followers(self.client, session, self.node.name, replicas)
        token = place_or_resume(self.client, session, self.node.name, lease)
        if replicas > 1 and replicas_of(self.client, session) is None:
            try:
                addresses = {n: a for n, a in live_nodes(self.client).items() if n in followers}
                if self.node.address.startswith("tls://"):
                    addresses[self.node.name] = self.node.address
                place_replicas(self.client, session, token, replicas, followers, addresses)
            except BaseException:
                unplace(self.client, session, self.node.name, token)
                raise
        self._read_replication(session)
        args = self.worker_args(session) if self.node.adopt(session, token, lease) else None
        if args is None:
            raise NotOwner(session, "placed, but the node's lease changed meanwhile")
        return args

    def claim(self, session: str) -> WorkerCluster | None:
        """Claim a session moved to this node; its worker arguments, or None if not ours."""
        claims = Claims()
        self.node.claim(session, claims)
        if session not in claims.served:
            why = {**claims.waiting, **claims.quarantined, **claims.demoted}.get(session)
            if why is None:
                return None
            raise NotOwner(session, why)
        self._read_replication(session)
        return self.worker_args(session)

    def move_step(
        self, op: str, session: str, fields: dict[str, object] | None = None
    ) -> dict[str, object]:
        """This node's part of a move between hosts (``seal``, ``pull``, ``release``, and
        ``discard`` after an abort; ``receive`` and ``install`` of a takeover's copy),
        each checked against the move etcd holds (``move_node``)."""
        name = self.node.name
        if op == "seal":
            return seal_here(self.client, name, self.home, session)
        if op == "pull":
            return pull_here(self.client, name, self.home, session, self.tls)
        if op == "discard":
            return discard_here(self.client, name, self.home, session)
        if op == "receive":
            return receive_here(self.client, self.home, session, fields or {})
        if op == "install":
            return install_here(self.client, self.home, session, fields or {})
        if op in REPLICA_STEPS:
            return self.replica_step(op, session)
        return release_here(self.client, name, self.home, session)

    def replica_step(self, op: str, session: str) -> dict[str, object]:
        """A replicated move's step here (docs/scaling.md 9.5), checked against etcd."""
        name = self.node.name
        if op == "demote":
            done = demote_here(self.client, name, self.home, session)
            self.node.drop(session)
            self.replication.pop(session, None)
            return done
        if op == "promote":
            return promote_here(self.client, name, self.home, session)
        if op == "unfollow":
            return unfollow_here(self.client, name, self.home, session)
        # refollow: the replica set read again; the worker restarts (the daemon's part)
        # and catches up every follower out of sync between its batches (worker.catch_up).
        if self.node.held(session) is None:
            raise NotOwner(session, "not owned here: its followers are not this node's to change")
        self.refollow(session)
        return {"session": session, "refollowed": self.replication.get(session) is not None}

    def refollow(self, session: str) -> bool:
        """Read ``session``'s replica set again (a move changed its followers: the mover's
        ``refollow``, or ``replica_watch``); True if its followers or their addresses
        differ from the ones read before."""
        with self._in_sync_lock:  # an in-sync change in flight writes the view too
            before = self.replication.get(session)
            self._read_replication(session)
            after = self.replication.get(session)
        return not same_followers(before, after)

    def close(self) -> None:
        """Revoke the lease (this node owns nothing any more) and close the etcd client."""
        self.node.close()
        self.client.close()
