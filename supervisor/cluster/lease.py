"""A node's etcd lease: registration, keepalive and the renew deadline (docs/scaling.md 2).

A node acknowledges a write only while ``now < last_sent + renew_deadline``, where
``last_sent`` is when the newest keepalive that etcd answered with a positive TTL was
*sent*: etcd restarts the countdown on receipt, later than that, so the node's own
view expires first. The keepalive runs in one thread of its own so that a slow or
absent etcd never stalls the node's event loop; the thread touches only the clock and
the published deadline.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from supervisor.cluster.errors import ClusterError, EtcdUnavailable
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.etcd_types import Get, Put, absent
from supervisor.cluster.keys import encode_value, node_key
from worker.lease_deadline import write_deadline

DEFAULT_TTL: Final = 10
RETRY_EVERY: Final = 0.2
"""Seconds between keepalive attempts while etcd does not answer."""


class NodeNameTaken(ClusterError):
    """Another live node is registered under this name."""

    def __init__(self, node: str, holder: str) -> None:
        super().__init__(node, holder)
        self.node = node
        self.holder = holder

    def __str__(self) -> str:
        return f"node {self.node!r} is already registered by a live node ({self.holder})"


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseTiming:
    """The lease TTL and the times derived from it, as Kubernetes' leader election does."""

    ttl: int = DEFAULT_TTL

    @property
    def renew_every(self) -> float:
        """Seconds between keepalives while etcd answers."""
        return self.ttl / 5

    @property
    def renew_deadline(self) -> float:
        """Seconds after a proven keepalive's send time during which writes may be acknowledged."""
        return self.ttl * 2 / 3


class LeaseClock:
    """When the lease was last proven and until when the node may acknowledge."""

    def __init__(self, renew_deadline: float) -> None:
        self.renew_deadline = renew_deadline
        self._lock = threading.Lock()
        self._proven_at = 0.0
        self._valid = False

    def proven(self, sent_at: float) -> None:
        """Record that a keepalive (or grant) sent at ``sent_at`` was answered positively."""
        with self._lock:
            self._proven_at = max(self._proven_at, sent_at) if self._valid else sent_at
            self._valid = True

    def lost(self) -> None:
        """Record that the lease is gone (expired or revoked): nothing is proven any more."""
        with self._lock:
            self._valid = False

    def deadline(self) -> float:
        """The monotonic time until which writes may be acknowledged (0.0: none)."""
        with self._lock:
            return self._proven_at + self.renew_deadline if self._valid else 0.0

    def can_acknowledge(self) -> bool:
        """True while the lease is proven within the renew deadline."""
        return time.monotonic() < self.deadline()


class NodeLease:
    """A node's registration under a lease it keeps alive, with its renew deadline."""

    def __init__(
        self,
        client: EtcdClient,
        node: str,
        address: dict[str, object],
        *,
        timing: LeaseTiming | None = None,
        deadline_path: str | None = None,
        on_new_lease: Callable[[int], None] | None = None,
    ) -> None:
        self.client = client
        self.node = node
        self.key = node_key(node)
        self.address = address
        self.timing = timing or LeaseTiming()
        self.clock = LeaseClock(self.timing.renew_deadline)
        self.lease_id = 0
        self.on_new_lease = on_new_lease
        self._deadline_path = deadline_path
        self._deadline_fd: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._callback_owed = False  # on_new_lease failed (etcd away): call it again

    def register(self) -> int:
        """Grant a lease and create the node key under it; NodeNameTaken if a live node has it."""
        sent = time.monotonic()
        lease = self.client.lease_grant(self.timing.ttl)
        value = encode_value({**self.address, "pid": os.getpid()})
        result = self.client.txn(
            [absent(self.key)],
            [Put(key=self.key, value=value, lease=lease.id)],
            [Get(key=self.key)],
        )
        if not result.succeeded:
            self.client.lease_revoke(lease.id)
            holder = result.reads[0][0].value.decode("utf-8", "replace") if result.reads[0] else ""
            raise NodeNameTaken(self.node, holder)
        self.lease_id = lease.id
        self.clock.proven(sent)
        self._publish()
        return lease.id

    def renew_once(self) -> bool:
        """Send one keepalive; True if the lease is proven again."""
        sent = time.monotonic()
        try:
            ttl = self.client.lease_keepalive(self.lease_id)
        except EtcdUnavailable:
            return False
        if ttl <= 0:
            self.clock.lost()
            self._publish()
            return False
        self.clock.proven(sent)
        self._publish()
        return True

    def start(self) -> None:
        """Start the keepalive thread (after ``register``)."""
        if self._deadline_path is not None and self._deadline_fd is None:
            self._deadline_fd = os.open(self._deadline_path, os.O_RDWR | os.O_CREAT, 0o600)
            self._publish()
        self._thread = threading.Thread(
            target=self._keep_alive, name="lease-keepalive", daemon=True
        )
        self._thread.start()

    def close(self, *, revoke: bool = True) -> None:
        """Stop the keepalive; revoke the lease (its keys vanish) unless told not to."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.clock.lost()
        self._publish()
        if self._deadline_fd is not None:
            os.close(self._deadline_fd)
            self._deadline_fd = None
        if revoke and self.lease_id:
            # Unreachable etcd: the lease expires on its own within its TTL.
            with contextlib.suppress(EtcdUnavailable):
                self.client.lease_revoke(self.lease_id)

    def _keep_alive(self) -> None:
        wait = self.timing.renew_every
        while not self._stop.wait(wait):
            if self.renew_once():
                wait = self.timing.renew_every
                if self._callback_owed:
                    self._call_back()
                continue
            wait = RETRY_EVERY
            if self.clock.deadline() == 0.0 and not self._stop.is_set():
                self._renew_registration()

    def _renew_registration(self) -> None:
        """The lease expired: register under a new one; owners re-acquire through the callback."""
        try:
            self.register()
        except ClusterError:
            return  # etcd away, or the name taken meanwhile: try again on the next round
        self._call_back()

    def _call_back(self) -> None:
        """Tell the owner of this lease that it is new; owed again if etcd failed meanwhile."""
        self._callback_owed = False
        if self.on_new_lease is None:
            return
        try:
            self.on_new_lease(self.lease_id)
        except ClusterError:
            self._callback_owed = True

    def _publish(self) -> None:
        if self._deadline_fd is not None and self._deadline_path is not None:
            write_deadline(
                self._deadline_fd, self.clock.deadline(), self._deadline_path, self.lease_id
            )
