"""The metrics of replicated sessions: each follower's lag and in-sync state, by session.

A replicated session's worker reports its followers as it sees them with each state
report (``worker.replication.Shipper.report``, in the counters' ``replication``). The
gauges show the live workers' latest reports; the two counters run from each worker's
start, and the daemon folds a departed worker's last counts into the session's totals,
so they never go backwards across restarts, hibernations and failovers back to this node.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from supervisor.hosting.metrics import Registry
from worker.wire import Message

COUNTERS = (
    ("in_sync_changes", "loopd_replica_in_sync_changes_total",
     "Followers taken out of or put back into the session's in-sync set in etcd by its owner."),
    ("writes_refused", "loopd_replicated_writes_refused_total",
     "Write batches refused before a byte was written: fewer copies in sync than needed."),
)  # fmt: skip


@dataclass(slots=True)
class ReplicaMetrics:
    """The latest ``replication`` report of each live worker, and departed counts."""

    latest: dict[str, tuple[float, Message]] = field(default_factory=dict)
    departed: dict[str, dict[str, int]] = field(default_factory=dict)

    def on_report(self, session: str, stats: Message) -> None:
        replication = stats.get("replication")
        if isinstance(replication, dict):
            self.latest[session] = (time.monotonic(), replication)

    def on_worker_gone(self, session: str) -> None:
        last = self.latest.pop(session, None)
        if last is None:
            return
        kept = self.departed.setdefault(session, {})
        for key, _name, _help in COUNTERS:
            kept[key] = kept.get(key, 0) + _count(last[1], key)

    def add_to(self, registry: Registry) -> None:
        """The replication families (HELP and TYPE even when no session is replicated)."""
        now = time.monotonic()
        lag = registry.gauge(
            "loopd_replica_lag_bytes",
            "Bytes the owner made durable since the follower's last acknowledgement.",
        )
        groups = registry.gauge(
            "loopd_replica_lag_groups",
            "Group commits the owner made durable since the follower's last acknowledgement.",
        )
        age = registry.gauge(
            "loopd_replica_ack_age_seconds", "Seconds since the follower's last acknowledgement."
        )
        in_sync = registry.gauge(
            "loopd_replica_in_sync", "1 if the follower is in the owner's in-sync set, else 0."
        )
        for session, (at, report) in sorted(self.latest.items()):
            followers = report.get("followers")
            for follower in followers if isinstance(followers, list) else []:
                node = follower.get("node") if isinstance(follower, dict) else None
                if not isinstance(follower, dict) or not isinstance(node, str):
                    continue
                labels = {"session": session, "follower": node}
                in_sync.set(1 if follower.get("in_sync") is True else 0, **labels)
                for family, key in ((lag, "lag_bytes"), (groups, "lag_groups")):
                    value = follower.get(key)
                    if type(value) is int:  # unknown (no acknowledgement yet): no sample
                        family.set(value, **labels)
                seconds = follower.get("ack_age_s")
                if isinstance(seconds, int | float):
                    age.set(round(seconds + max(0.0, now - at), 3), **labels)
        sessions = sorted(set(self.latest) | set(self.departed))
        for key, name, text in COUNTERS:
            counter = registry.counter(name, text)
            for session in sessions:
                report = self.latest.get(session, (0.0, {}))[1]
                total = self.departed.get(session, {}).get(key, 0) + _count(report, key)
                counter.inc(total, session=session)


def _count(report: Mapping[str, object], key: str) -> int:
    value = report.get(key)
    return value if type(value) is int and value >= 0 else 0
