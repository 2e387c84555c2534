"""The owner keeps each worker's followers equal to the replica set etcd holds.

A replicated session's worker is started with its followers' names and addresses
(``WorkerReplication``). When a move changes the followers in etcd (``grow``, ``shrink``:
``replica_grow``) its mover asks the owner to ``refollow``; a mover killed between its
transaction and that call left the worker counting a follower etcd no longer lists, or
never shipping to one just added. This thread of the owner's node sees it on its own:
an etcd watch of ``/loopd/replicas/`` wakes it at once when the set of a session it
holds is written, and it looks at every such session at least every ``interval`` s
whatever happened (an event missed, etcd away and back). A session whose followers
(names, or the address of a live one) differ from the node's view is read again (under
the lock an in-sync change takes) and handed to the daemon, which restarts its running
worker with them, as ``refollow`` does. The in-sync set is not compared: its changes
are the worker's own. Every etcd call is made here, never in the daemon's loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from supervisor.cluster.errors import ClusterError
from supervisor.cluster.keys import PREFIX
from supervisor.cluster.replica_placement import WorkerReplication
from supervisor.cluster.replica_set import ReplicaSet, parse_replica_set
from supervisor.cluster.routing import live_nodes

if TYPE_CHECKING:
    from supervisor.cluster.serving import ServingNode

REPLICAS: Final = f"{PREFIX}replicas/"
SCAN_EVERY: Final = 2.0  # seconds: the longest a missed change waits
WATCH_SLICE: Final = 1.0  # seconds of one watch call: a close waits for one at most


def followers_differ(view: WorkerReplication, current: ReplicaSet, live: dict[str, str]) -> bool:
    """True if etcd's set lists other followers than ``view`` (the worker's), or another
    address for one: a live node's registered address, else the one the set keeps. A
    follower not registered now (its node down) keeps the worker's address if it has one:
    its node's death is no change of the set."""
    known = dict(view.followers)
    if set(known) != set(current.followers):
        return True
    kept = dict(current.addresses)
    for name, address in known.items():
        found = live.get(name)
        if found is not None and found != address:
            return True
        if found is None and not address and kept.get(name):
            return True
    return False


class ReplicaWatch:
    """The thread that finds a session's followers changed in etcd behind its worker."""

    def __init__(
        self,
        serving: ServingNode,
        on_changed: Callable[[str], None],
        report: Callable[[str], None],
        interval: float = SCAN_EVERY,
    ) -> None:
        self.serving = serving
        self.client = serving.client
        self.on_changed = on_changed  # (session): called in this thread, its view read again
        self.report = report
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bad: dict[str, int] = {}  # session -> the revision of a bad value reported

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="loopd-replicas", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._held():  # nothing to compare: etcd is not asked
                self._stop.wait(self.interval)
                continue
            since = self._revision()
            self.scan()
            self._wait(since)

    def _revision(self) -> int | None:
        """etcd's revision now (None: unreachable): the watch starts after it."""
        try:
            return self.client.txn([], []).revision
        except ClusterError:
            return None

    def _held(self) -> set[str]:
        """The replicated sessions this node holds (its view names followers of)."""
        node = self.serving.node
        return {s for s in node.held_sessions() if self.serving.replication.get(s) is not None}

    def _wait(self, since: int | None) -> None:
        """Until the replica set of a session held here is written or deleted after
        revision ``since``, at most ``interval`` s (the scan runs then anyway)."""
        deadline = time.monotonic() + self.interval
        start = None if since is None else since + 1
        while start is not None and not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                events = self.client.watch(
                    REPLICAS, start_revision=start, prefix=True, wait=min(left, WATCH_SLICE)
                )
            except ClusterError:
                break  # etcd away: the scan at the deadline tries again
            held = self._held()
            if any(event.kv.key.removeprefix(REPLICAS) in held for event in events):
                return
            if events:  # another session's set: watch on after it
                start = max(event.kv.mod_revision for event in events) + 1
        self._stop.wait(max(0.0, deadline - time.monotonic()))

    def scan(self) -> list[str]:
        """Compare every replicated session held here with etcd's set; those whose
        followers were read again (and handed to ``on_changed``)."""
        held = self._held()
        if not held:
            return []
        try:
            kvs = self.client.range(REPLICAS, prefix=True)
            live = live_nodes(self.client)
        except ClusterError:
            return []  # etcd away: the next scan
        changed = []
        for kv in kvs:
            session = kv.key.removeprefix(REPLICAS)
            view = self.serving.replication.get(session)
            if session not in held or view is None or self._stop.is_set():
                continue
            try:
                current = parse_replica_set(kv.value, kv.mod_revision)
            except ClusterError as exc:
                if self._bad.get(session) != kv.mod_revision:
                    self._bad[session] = kv.mod_revision
                    self.report(f"cluster: {session}: its replica set in etcd is not "
                                f"readable, its worker's followers are kept: {exc}")  # fmt: skip
                continue
            self._bad.pop(session, None)
            if current.replicas <= 1 or not followers_differ(view, current, live):
                continue
            try:
                if not self.serving.refollow(session):
                    continue  # read again meanwhile (a mover's refollow): nothing to do
            except ClusterError:
                continue  # etcd away: the next scan
            self.on_changed(session)
            changed.append(session)
        return changed
