"""``loopd serve --cluster URL --node NAME``: what the daemon asks of the cluster.

At start the daemon registers the node and claims the sessions on its disk (quarantining
copies it may no longer serve) before it hosts any; each worker is then started with its
session's token and the node's lease (``WorkerCluster``). A new session is placed and
owned in etcd before its worker creates it. Every etcd call ends by ``CALL_TIMEOUT`` in
all (``gateway_http``); those of ``place`` and ``claim`` are made in a thread of the
daemon (``supervisor/daemon/cluster_node.py``), never in its loop.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Final

from supervisor.cluster.errors import NotOwner
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.lease import LeaseTiming, NodeNameTaken
from supervisor.cluster.ownership import place_or_resume
from supervisor.cluster.transport import TlsFiles, TransportError
from supervisor.errors import ServeError
from supervisor.moves.move_node import discard_here, pull_here, release_here, seal_here
from supervisor.moves.receive_copy import install_here, receive_here
from supervisor.node.node import LEASE_FILE, Claims, ClusterNode

CALL_TIMEOUT: Final = 2.0
NAME_RETRY: Final = 0.2
"""Seconds between attempts to register a name still held by a former lease."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerCluster:
    """What a cluster worker is started with: its node, token, lease and the lease file."""

    node: str
    token: int
    lease: int
    lease_file: str
    tls: TlsFiles | None = None
    """The node's certificate (``--listen``): the worker makes the handshake of each TCP
    connection the node's TLS thread hands it (docs/scaling.md, "How the port is served")."""

    def argv(self) -> list[str]:
        argv = [
            "--cluster-node", self.node, "--cluster-token", str(self.token),
            "--cluster-lease", str(self.lease), "--lease-file", self.lease_file,
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
        store: str | None = None,
    ) -> None:
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
            self.client, name, home, timing=timing, address=address, stored=bool(store)
        )
        self.lease_file = os.path.join(home, LEASE_FILE)

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
                return sorted(claims.served)

    def worker_args(self, session: str) -> WorkerCluster | None:
        """The cluster arguments of ``session``'s worker; None if this node does not own it."""
        held = self.node.held(session)
        if held is None:
            return None
        token, lease = held
        return WorkerCluster(
            node=self.node.name, token=token, lease=lease, lease_file=self.lease_file,
            tls=self.tls if self.address is not None else None,
        )  # fmt: skip

    def place(self, session: str) -> WorkerCluster:
        """Place and own a new session on this node, which holds no files of it.

        AlreadyPlaced if it exists on any node; NotOwner if the node's lease changed
        meanwhile; any other ClusterError if etcd did not answer in time or answered
        badly: then nothing was placed, or a placement was made whose reply was lost,
        which a retry on this node takes up (``place_or_resume``).
        """
        lease = self.node.lease.lease_id
        token = place_or_resume(self.client, session, self.node.name, lease)
        args = self.worker_args(session) if self.node.adopt(session, token, lease) else None
        if args is None:
            raise NotOwner(session, "placed, but the node's lease changed meanwhile")
        return args

    def claim(self, session: str) -> WorkerCluster | None:
        """Claim a session moved to this node; its worker arguments, or None if not ours."""
        claims = Claims()
        self.node.claim(session, claims)
        if session not in claims.served:
            why = {**claims.waiting, **claims.quarantined}.get(session)
            if why is None:
                return None
            raise NotOwner(session, why)
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
        return release_here(self.client, name, self.home, session)

    def close(self) -> None:
        """Revoke the lease (this node owns nothing any more) and close the etcd client."""
        self.node.close()
        self.client.close()
