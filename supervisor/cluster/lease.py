"""A node's etcd lease: registration, keepalive and the renew deadline (docs/scaling.md 2).

A node acknowledges a write only while ``now < last_sent + renew_deadline``, where
``last_sent`` is when the newest keepalive that etcd answered with a positive TTL was
*sent*: etcd restarts the countdown on receipt, later than that, so the node's own
view expires first. The keepalive runs in one thread of its own so that a slow or
absent etcd never stalls the node's event loop; the thread touches only the clock and
the published deadline. No reply of etcd ends that thread (an error status during an
election, a body that is not JSON, a TTL that is not an integer, a reply that never
ends): it reports the trouble once, keeps trying, and says when the lease is proven
again; a lease etcd says is gone is replaced by a new one.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from supervisor.cluster.background import Background
from supervisor.cluster.errors import ClusterError
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.etcd_types import Get, Put, absent
from supervisor.cluster.keys import encode_value, node_key
from worker.ipc.lease_deadline import write_deadline

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
        self.on_problem: Callable[[str], None] | None = None  # one line per change of health
        self._keeper = Background("lease-keepalive", self._keep_alive)
        self._stop = self._keeper.stopping
        self._callback_owed = False  # on_new_lease failed (etcd away): call it again
        self._failing = 0  # keepalive rounds failed in a row
        self._trouble_kind = ""  # what the last of them was, told once

    @property
    def stopping(self) -> bool:
        """True once ``close`` began: long work in the keepalive thread should end."""
        return self._stop.is_set()

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
        except ClusterError as exc:
            self._trouble("renew", f"lease {self.lease_id} not renewed: {exc}")
            return False
        if ttl <= 0:
            self.clock.lost()
            self._publish()
            self._trouble(
                "expired", f"lease {self.lease_id} expired in etcd; registering under a new one"
            )
            return False
        self.clock.proven(sent)
        self._publish()
        if self._failing:
            self._tell(f"lease {self.lease_id} proven again after {self._failing} failed rounds")
            self._failing, self._trouble_kind = 0, ""
        return True

    def start(self) -> None:
        """Start the keepalive thread (after ``register``)."""
        if self._deadline_path is not None and self._deadline_fd is None:
            self._deadline_fd = os.open(self._deadline_path, os.O_RDWR | os.O_CREAT, 0o600)
            self._publish()
        self._keeper.start()

    def close(self, *, revoke: bool = True) -> None:
        """Stop the keepalive; revoke the lease (its keys vanish) unless told not to."""
        self._keeper.stop()
        self.clock.lost()
        self._publish()
        if self._deadline_fd is not None:
            os.close(self._deadline_fd)
            self._deadline_fd = None
        if revoke and self.lease_id:
            # etcd unreachable or slow: the lease expires on its own within its TTL. Already
            # gone ("requested lease not found": it expired while etcd was away or did not
            # hear us): there is nothing left to revoke. Either way this node owns nothing.
            with contextlib.suppress(ClusterError):
                self.client.lease_revoke(self.lease_id)

    def _keep_alive(self) -> None:
        """The keepalive thread's main: one round after another until ``close``."""
        wait = self.timing.renew_every
        while not self._stop.wait(wait):
            try:
                wait = self._round()
            except Exception as exc:  # noqa: BLE001 - the thread's main: no error may end it
                self._trouble("unexpected", f"lease keepalive: unexpected {exc!r}; trying again")
                wait = RETRY_EVERY

    def _round(self) -> float:
        """One keepalive (or registration) attempt; the seconds to wait before the next."""
        # A lease etcd said is gone is not kept alive again: a new one is registered.
        if self.clock.deadline() != 0.0 and self.renew_once():
            if self._callback_owed:
                self._call_back()
            return self.timing.renew_every
        if self.clock.deadline() == 0.0 and not self._stop.is_set():
            self._renew_registration()
        return RETRY_EVERY

    def _renew_registration(self) -> None:
        """The lease expired: register under a new one; owners re-acquire through the callback."""
        try:
            self.register()
        except ClusterError as exc:  # etcd away, or the name taken meanwhile: next round
            self._trouble("register", f"registration of node {self.node!r} failed: {exc}")
            return
        self._tell(f"registered under a new lease {self.lease_id}")
        self._failing, self._trouble_kind = 0, ""
        self._call_back()

    def _call_back(self) -> None:
        """Tell the owner of this lease that it is new; owed again until it succeeds."""
        if self.on_new_lease is None:
            self._callback_owed = False
            return
        self._callback_owed = True  # still owed if anything below raises
        try:
            self.on_new_lease(self.lease_id)
        except ClusterError as exc:
            self._trouble(
                "claims", f"claims under lease {self.lease_id} failed: {exc}; trying again"
            )
            return
        self._callback_owed = False

    def _trouble(self, kind: str, line: str) -> None:
        """Count a failed round; tell it when its kind changed (not one line per retry)."""
        self._failing += 1
        if kind != self._trouble_kind:
            self._trouble_kind = kind
            self._tell(line)

    def _tell(self, line: str) -> None:
        if self.on_problem is not None:
            self.on_problem(line)

    def _publish(self) -> None:
        if self._deadline_fd is not None and self._deadline_path is not None:
            write_deadline(
                self._deadline_fd, self.clock.deadline(), self._deadline_path, self.lease_id
            )
