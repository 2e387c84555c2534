"""Failover of sessions kept in a database: another node claims them when a node is gone.

A thread of the node, woken by an owner key's deletion (an etcd watch of
``/loopd/owner/``: a lease expired with its node) and at least every third of the lease
TTL, scans etcd's placements: a session placed on a node that is no longer registered
(its lease expired with it) and owned by nobody is taken over here in one transaction
(``stored.take_over_stored``, a higher token) and handed to the daemon, whose worker
opens it from the database with that token. The deposed node's worker, if it still
runs, has every later write refused in its transaction. Of several nodes the first to
try wins; the others find an owner.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from supervisor.cluster.background import Background
from supervisor.cluster.errors import ClusterError
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import PREFIX
from supervisor.cluster.ownership import owner_of
from supervisor.node.node import ClusterNode
from supervisor.node.stored import orphans, placed_on, take_over_stored, takeover_order

OWNERS = f"{PREFIX}owner/"
WATCH_SLICE: Final = 1.0  # seconds of one watch call


class StoredFailoverWatch:
    """The failover thread of a node whose sessions are in a database."""

    def __init__(
        self,
        client: EtcdClient,
        node: ClusterNode,
        interval: float,
        on_taken: Callable[[str, int], None],
        report: Callable[[str], None],
    ) -> None:
        self.client = client
        self.node = node
        self.interval = interval
        self.on_taken = on_taken  # (session, token): called in this thread
        self.report = report
        self._watch = Background("loopd-failover", self._run)
        self._stop = self._watch.stopping
        self._woken: float | None = None  # when the last deletion of an owner key was seen

    def start(self) -> None:
        self._watch.start()

    def close(self) -> None:
        self._watch.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            since = self._revision()
            taken = self.scan()
            self.adopt_unserved(skip=frozenset(taken))
            self._wait(since)

    def _revision(self) -> int | None:
        """etcd's revision now (None: unreachable): the watch starts after it."""
        try:
            return self.client.txn([], []).revision
        except ClusterError:
            return None

    def _wait(self, since: int | None) -> None:
        """Until an owner key is deleted after revision ``since`` (a lease expired with its
        node: the next scan takes over at once), at most ``interval`` s: the scan runs
        then anyway (a deletion missed, a takeover whose claim failed)."""
        deadline = time.monotonic() + self.interval
        start = None if since is None else since + 1
        while start is not None and not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:  # in slices: a close never waits for more than one
                events = self.client.watch(
                    OWNERS, start_revision=start, prefix=True, wait=min(left, WATCH_SLICE)
                )
            except ClusterError:
                break
            if any(event.kind == "DELETE" for event in events):
                self._woken = time.monotonic()
                return
            if events:  # an owner written (a takeover, a claim): watch on after it
                start = max(event.kv.mod_revision for event in events) + 1
        self._stop.wait(max(0.0, deadline - time.monotonic()))

    def scan(self) -> list[str]:
        """Take over every session whose node is gone; the sessions taken over here."""
        if self._stop.is_set() or self.node.lease.stopping:
            return []
        try:
            gone = orphans(self.client, self.node.name)
        except ClusterError:
            return []  # etcd unreachable: look again later
        taken = []
        for session in takeover_order(gone, self.node.name):
            if self._stop.is_set() or self.node.lease.stopping:
                break
            try:
                takeover = take_over_stored(
                    self.client, session, self.node.name, self.node.lease.lease_id, gone[session]
                )
            except ClusterError:
                continue  # another node won, the node came back, or etcd is away
            now = time.monotonic()
            woken = self._woken
            seen = "" if woken is None else f"an owner key's deletion seen at {woken:.3f}, "
            self.report(
                f"cluster: {session}: taken over from {takeover.previous} with token "
                f"{takeover.token}: "
                f"opened from the database here ({seen}taken over at {now:.3f}, CLOCK_MONOTONIC)"
            )
            self.on_taken(session, takeover.token)
            taken.append(session)
        return taken

    def adopt_unserved(self, skip: frozenset[str] = frozenset()) -> list[str]:
        """Serve each session placed on and owned by this node that no claim here holds (a
        takeover whose claim failed, a node killed between the two)."""
        adopted = []
        try:
            names = placed_on(self.client, self.node.name)
        except ClusterError:
            return []
        for session in names:
            if self._stop.is_set() or self.node.lease.stopping:
                break
            if session in skip or self.node.held(session) is not None:
                continue
            try:
                owner = owner_of(self.client, session)
            except ClusterError:
                continue
            if owner is None or owner.node != self.node.name:
                continue
            self.report(f"cluster: {session}: owned here (token {owner.token}) and served "
                        "by nobody: served here")  # fmt: skip
            self.on_taken(session, owner.token)
            adopted.append(session)
        return adopted
