"""A worker's counters for the supervisor's metrics: fsync latency, bytes written, requests, tokens.

Kept in plain integers and one list of bucket counts so that recording costs a few
additions; the supervisor receives a snapshot with each state report and adds the workers'
histograms bucket by bucket, which is why the bounds are fixed here, once.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Final

from worker.store.format.dataclass_methods import MutableValue

LATENCY_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip
"""Seconds: the bounds of every latency histogram of loopd (the last bucket is +Inf)."""


@dataclass(slots=True, repr=False, eq=False)
class Histogram(MutableValue):
    """Counts per bucket of ``LATENCY_BUCKETS`` (the last one past the highest bound)."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds


@dataclass(slots=True, repr=False, eq=False)
class WorkerStats(MutableValue):
    """Everything a worker counts since it started."""

    requests: int = 0
    bytes_written: int = 0
    fsync: Histogram = field(default_factory=Histogram)
    request_latency: Histogram = field(default_factory=Histogram)
    prompt_tokens: int = 0
    """Of the ``Usage`` records this worker wrote (durable), as completion_tokens."""
    completion_tokens: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    """Requests refused, by the wire's error code."""

    def reset(self) -> None:
        """Start counting from zero (a forked worker inherits its parent's counts)."""
        self.requests = 0
        self.bytes_written = 0
        self.fsync = Histogram()
        self.request_latency = Histogram()
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.errors = {}

    def snapshot(self) -> dict[str, object]:
        """The counters as a wire-ready map (sent with each state report)."""
        return {
            "requests": self.requests,
            "bytes_written": self.bytes_written,
            "fsync_counts": list(self.fsync.counts),
            "fsync_sum": self.fsync.total,
            "latency_counts": list(self.request_latency.counts),
            "latency_sum": self.request_latency.total,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "errors": dict(self.errors),
        }


STATS: Final = WorkerStats()
"""This process's counters (one worker per process)."""
