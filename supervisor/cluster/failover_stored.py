"""Failover of sessions kept in a database: another node claims them when a node is gone.

The same thread as ``failover_watch`` (woken by an owner key's deletion, and at least
every third of the lease TTL), scanning etcd's placements instead of a follower's
copies: a session placed on a node that is no longer registered (its lease expired
with it) and owned by nobody is taken over here in one transaction
(``stored.take_over_stored``, a higher token) and handed to the daemon, whose worker
opens it from the database with that token. The deposed node's worker, if it still
runs, has every later write refused in its transaction. Of several nodes the first to
try wins; the others find an owner.
"""

from __future__ import annotations

import time

from supervisor.cluster.errors import ClusterError
from supervisor.cluster.failover_watch import FailoverWatch
from supervisor.cluster.ownership import owner_of
from supervisor.cluster.stored import orphans, placed_on, take_over_stored


class StoredFailoverWatch(FailoverWatch):
    """The failover thread of a node whose sessions are in a database."""

    def scan(self) -> list[str]:
        """Take over every session whose node is gone; the sessions taken over here."""
        if self._stop.is_set() or self.node.lease.stopping:
            return []
        try:
            gone = orphans(self.client, self.node.name)
        except ClusterError:
            return []  # etcd unreachable: look again later
        taken = []
        for session, previous in sorted(gone.items()):
            if self._stop.is_set() or self.node.lease.stopping:
                break
            try:
                takeover = take_over_stored(
                    self.client, session, self.node.name, self.node.lease.lease_id
                )
            except ClusterError:
                continue  # another node won, the node came back, or etcd is away
            now = time.monotonic()
            woken = self._woken
            seen = "" if woken is None else f"an owner key's deletion seen at {woken:.3f}, "
            self.report(
                f"cluster: {session}: taken over from {previous} with token {takeover.token}: "
                f"opened from the database here ({seen}taken over at {now:.3f}, CLOCK_MONOTONIC)"
            )
            self.on_promoted(session, takeover.token)
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
            self.on_promoted(session, owner.token)
            adopted.append(session)
        return adopted
