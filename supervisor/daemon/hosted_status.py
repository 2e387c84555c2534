"""The status row of one hosted session, as ``loopd status`` and its replies show it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from supervisor.states import State
from worker.wire import Message


class RunningWorker(Protocol):
    """What a status row reads of a live worker process."""

    @property
    def pid(self) -> int: ...
    def rss_bytes(self) -> int | None: ...
    def cpu_seconds(self) -> float | None: ...
    @property
    def replication(self) -> FollowersSeen | None: ...


class StatusSource(Protocol):
    """What a status row reads of a hosted session (passed in: this module is below it)."""

    @property
    def id(self) -> str: ...
    @property
    def state(self) -> State: ...
    @property
    def worker(self) -> RunningWorker | None: ...
    @property
    def started_at(self) -> float | None: ...
    @property
    def epoch(self) -> int | None: ...
    @property
    def records(self) -> int | None: ...
    @property
    def restarts(self) -> int: ...
    @property
    def last_error(self) -> str | None: ...
    @property
    def schedules(self) -> object: ...


def session_status(hosted: StatusSource) -> Message:
    """State, pid, epoch, records, restarts, uptime, rss, cpu and last error of a session;
    and ``lag``, its followers' (a replicated session's owner, once its worker reported)."""
    worker = hosted.worker
    running = hosted.state in (State.RUNNING, State.STARTING, State.STOPPING)
    started = hosted.started_at
    uptime = time.monotonic() - started if running and started else None
    lag = worker.replication if worker is not None else None
    return {
        "session": hosted.id,
        "state": hosted.state.value,
        "pid": worker.pid if worker is not None else None,
        "epoch": hosted.epoch,
        "records": hosted.records,
        "restarts": hosted.restarts,
        "uptime_s": round(uptime, 3) if uptime is not None else None,
        "rss_bytes": worker.rss_bytes() if worker is not None else None,
        "cpu_s": worker.cpu_seconds() if worker is not None else None,
        "last_error": hosted.last_error,
        **scheduled(hosted.schedules),
        **({} if lag is None else {"lag": lag.now(time.monotonic())}),
    }


def scheduled(summary: object) -> Message:
    """``scheduled`` (pending requests) and ``next_due`` of a worker's summary; None if
    unknown (not started since the daemon started, and no file: nothing was reported)."""
    if isinstance(summary, list) and len(summary) == 2 and type(summary[0]) is int:
        return {"scheduled": summary[0], "next_due": summary[1]}
    return {"scheduled": None, "next_due": None}


@dataclass(frozen=True, slots=True)
class FollowersSeen:
    """A replicated session's followers as its worker last reported them
    (``worker.replication.Shipper.report``): each one's node, whether it is in the
    worker's in-sync set, its lag in bytes and group commits, its last ack's age."""

    at: float  # time.monotonic() at the report
    followers: tuple[Message, ...]

    def now(self, now: float) -> list[Message]:
        """The followers, each last acknowledgement's age brought up to ``now``."""
        rows = []
        for follower in self.followers:
            age = follower.get("ack_age_s")
            if isinstance(age, int | float):
                age = round(age + max(0.0, now - self.at), 3)
            rows.append({**follower, "ack_age_s": age if isinstance(age, float) else None})
        return rows


def followers_seen(stats: object) -> FollowersSeen | None:
    """The followers of a worker's state report's counters, if it reports any."""
    replication = stats.get("replication") if isinstance(stats, dict) else None
    followers = replication.get("followers") if isinstance(replication, dict) else None
    if not isinstance(followers, list):
        return None
    return FollowersSeen(time.monotonic(), tuple(f for f in followers if isinstance(f, dict)))


def int_or_none(value: object) -> int | None:
    """A count a worker reported, or None if it is not an int."""
    return value if type(value) is int else None
