"""The status row of one hosted session, as ``loopd status`` and its replies show it."""

from __future__ import annotations

import time
from typing import Protocol

from supervisor.hosting.epoch_apps import EpochApp, epoch_app
from supervisor.sessions.spawn import WorkerSpec
from supervisor.states import State
from worker.ipc.wire import Message


class RunningWorker(Protocol):
    """What a status row reads of a live worker process."""

    @property
    def pid(self) -> int: ...
    def rss_bytes(self) -> int | None: ...
    def cpu_seconds(self) -> float | None: ...


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
    @property
    def tokens(self) -> int | None: ...
    @property
    def spec(self) -> WorkerSpec: ...
    @property
    def epoch_app(self) -> EpochApp | None: ...


def session_status(hosted: StatusSource) -> Message:
    """State, pid, epoch, records, restarts, uptime, rss, cpu, last error, and the App and
    version of its current epoch of a session."""
    worker = hosted.worker
    running = hosted.state in (State.RUNNING, State.STARTING, State.STOPPING)
    started = hosted.started_at
    uptime = time.monotonic() - started if running and started else None
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
        "tokens": hosted.tokens,
        **scheduled(hosted.schedules),
        **app_of(hosted),
    }


def app_of(hosted: StatusSource) -> Message:
    """``app`` and ``app_version`` of the session's current epoch's SessionStart: read
    from its log in a home; in a database, as its worker last reported them, or as serve
    read them at start (None before either: no status call asks the database)."""
    spec = hosted.spec
    if spec.store:
        app, version = hosted.epoch_app or (None, None)
    else:
        app, version = epoch_app(spec.home, hosted.id, hosted.epoch)
    return {"app": app, "app_version": version}


def scheduled(summary: object) -> Message:
    """``scheduled`` (pending requests) and ``next_due`` of a worker's summary; None if
    unknown (not started since the daemon started, and no file: nothing was reported)."""
    if isinstance(summary, list) and len(summary) == 2 and type(summary[0]) is int:
        return {"scheduled": summary[0], "next_due": summary[1]}
    return {"scheduled": None, "next_due": None}


def tokens_reported(stats: object) -> int | None:
    """Prompt and completion tokens of the Usage records a worker's counters name (since
    that worker started); None if it named none."""
    if not isinstance(stats, dict):
        return None
    counts = [stats.get("prompt_tokens"), stats.get("completion_tokens")]
    return sum(c for c in counts if type(c) is int) if any(type(c) is int for c in counts) else None


def int_or_none(value: object) -> int | None:
    """A count a worker reported, or None if it is not an int."""
    return value if type(value) is int else None
