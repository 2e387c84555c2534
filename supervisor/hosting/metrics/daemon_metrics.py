"""The daemon's metrics: its own counters plus what its workers report after their requests.

Rendering reads nothing of the workers: their RSS comes from a cache filled a few
workers a loop turn (rss_cache.py), so a scrape costs the loop the same at 5 workers and
at 500.

A worker's counters run from its start; the daemon keeps each live worker's latest
snapshot and, when a worker goes, folds that snapshot into the totals of the departed,
so a counter never goes backwards across restarts and hibernations (a worker's last
interval between its final report and its death is the only thing not counted).
"""

from __future__ import annotations

import os
from collections import Counter as Tally
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import psutil

from supervisor.hosting.metrics.exposition import HistogramValue, Registry
from worker.ipc.wire import Message

DEFAULT_APP_LABEL = "default"
"""The ``app`` label of sessions of the default App (no --app, no named App)."""


@dataclass(slots=True)
class _Totals:
    requests: int = 0
    bytes_written: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    fsync: HistogramValue = field(default_factory=HistogramValue)
    latency: HistogramValue = field(default_factory=HistogramValue)
    errors: Tally[str] = field(default_factory=Tally)

    def add(self, snapshot: Message) -> None:
        errors = snapshot.get("errors")
        if isinstance(errors, dict):
            for code, count in errors.items():
                if isinstance(code, str) and type(count) is int:
                    self.errors[code] += count
        for name in ("requests", "bytes_written", "prompt_tokens", "completion_tokens"):
            value = snapshot.get(name)
            if type(value) is int:
                setattr(self, name, getattr(self, name) + value)
        for hist, prefix in ((self.fsync, "fsync"), (self.latency, "latency")):
            counts, total = snapshot.get(f"{prefix}_counts"), snapshot.get(f"{prefix}_sum")
            if isinstance(counts, list) and all(isinstance(c, int) for c in counts):
                hist.add(counts, float(total) if isinstance(total, int | float) else 0.0)


class DaemonMetrics:
    """Counts what the daemon sees and renders the exposition on demand."""

    def __init__(
        self,
        states: Callable[[], Iterable[str]],
        worker_rss: Callable[[], Iterable[int]],
        state_names: Iterable[str],
        *,
        live_workers: Callable[[], int] | None = None,
        rss_reads: Callable[[], int] | None = None,
    ) -> None:
        self._states = states
        self._worker_rss = worker_rss
        self._live_workers = live_workers
        self._rss_reads = rss_reads
        self._state_names = tuple(state_names)
        self._latest: dict[str, Message] = {}
        self._departed = _Totals()
        self._apps: dict[str, str] = {}  # session -> its App's label, as last reported
        self._departed_by_app: dict[str, _Totals] = {}
        self.restarts = 0
        self.epoch_changes = 0
        self.hibernations = 0
        self.wakeups = 0
        self.memory_restarts = 0
        self.events = 0
        self._me = psutil.Process(os.getpid())

    def on_report(self, session: str, stats: object, app: str = DEFAULT_APP_LABEL) -> None:
        """A worker's state report carried its counters (``app``: its App's target,
        ``module:attribute``, or the default App's label)."""
        if isinstance(stats, dict):
            self._latest[session] = stats
            self._apps[session] = app

    def on_worker_gone(self, session: str) -> None:
        last = self._latest.pop(session, None)
        app = self._apps.pop(session, DEFAULT_APP_LABEL)
        if last is not None:
            self._departed.add(last)
            self._departed_by_app.setdefault(app, _Totals()).add(last)

    def _by_app(self) -> dict[str, _Totals]:
        """Each App's totals: its departed workers' and its live workers' latest."""
        apps = {app: _Totals() for app in self._departed_by_app}
        for app, departed in self._departed_by_app.items():
            apps[app].add(_as_message(departed))
        for session, snapshot in self._latest.items():
            apps.setdefault(self._apps.get(session, DEFAULT_APP_LABEL), _Totals()).add(snapshot)
        return apps

    def render(self) -> str:
        totals = _Totals()
        totals.add(_as_message(self._departed))
        for snapshot in self._latest.values():
            totals.add(snapshot)
        registry = Registry()
        by_state = Tally(self._states())
        sessions = registry.gauge("loopd_sessions", "Sessions known to the supervisor, by state.")
        for name in self._state_names:
            sessions.set(by_state.get(name, 0), state=name)
        rss = list(self._worker_rss())
        live = self._live_workers() if self._live_workers is not None else len(rss)
        registry.gauge("loopd_live_workers", "Worker processes alive now.").set(live)
        registry.gauge("loopd_workers_rss_bytes", "Resident set size of all live workers.").set(
            sum(rss)
        )
        registry.gauge("loopd_supervisor_rss_bytes", "Resident set size of the supervisor.").set(
            self._me.memory_info().rss
        )
        for name, value, text in (
            ("loopd_restarts_total", self.restarts, "Worker restarts after a crash."),
            ("loopd_memory_restarts_total", self.memory_restarts,
             "Workers restarted for growing past --max-rss."),
            ("loopd_hibernations_total", self.hibernations, "Workers hibernated."),
            ("loopd_wakeups_total", self.wakeups, "Hibernated sessions started on demand."),
            ("loopd_epoch_changes_total", self.epoch_changes, "Epoch commits seen."),
            ("loopd_events_total", self.events, "State changes published."),
            ("loopd_requests_total", totals.requests, "Requests answered by workers."),
            ("loopd_appended_bytes_total", totals.bytes_written,
             "Bytes written to session files by workers."),
        ):  # fmt: skip
            registry.counter(name, text).inc(value)
        if self._rss_reads is not None:
            registry.counter(
                "loopd_rss_reads_total", "Workers' RSS read for the metrics (off the scrapes)."
            ).inc(self._rss_reads())
        fsync = registry.histogram("loopd_fsync_seconds", "Workers' fdatasync latency.")
        fsync.histograms[()] = totals.fsync
        latency = registry.histogram(
            "loopd_request_seconds", "Time from a request's arrival in its worker to its reply."
        )
        latency.histograms[()] = totals.latency
        tokens = registry.counter("loopd_tokens_total", "Tokens of the Usage records written.")
        tokens.inc(totals.prompt_tokens, kind="prompt")
        tokens.inc(totals.completion_tokens, kind="completion")
        errors = registry.counter("loopd_request_errors_total", "Requests refused, by code.")
        for code, count in sorted(totals.errors.items()):
            errors.inc(count, code=code)
        self._render_apps(registry)
        return registry.render()

    def _render_apps(self, registry: Registry) -> None:
        """The same figures by App (its target, ``module:attribute``, or "default"): a
        label of bounded cardinality (the Apps configured), never a session id."""
        requests = registry.counter("loopd_app_requests_total", "Requests answered, by App.")
        tokens = registry.counter("loopd_app_tokens_total", "Tokens of Usage records, by App.")
        latency = registry.histogram("loopd_app_request_seconds", "Request latency, by App.")
        errors = registry.counter("loopd_app_request_errors_total", "Refusals, by App and code.")
        for app, totals in sorted(self._by_app().items()):
            requests.inc(totals.requests, app=app)
            tokens.inc(totals.prompt_tokens, app=app, kind="prompt")
            tokens.inc(totals.completion_tokens, app=app, kind="completion")
            latency.histogram(app=app).add(totals.latency.counts, totals.latency.total)
            for code, count in sorted(totals.errors.items()):
                errors.inc(count, app=app, code=code)


def _as_message(totals: _Totals) -> Message:
    return {
        "requests": totals.requests,
        "bytes_written": totals.bytes_written,
        "prompt_tokens": totals.prompt_tokens,
        "completion_tokens": totals.completion_tokens,
        "errors": dict(totals.errors),
        "fsync_counts": totals.fsync.counts,
        "fsync_sum": totals.fsync.total,
        "latency_counts": totals.latency.counts,
        "latency_sum": totals.latency.total,
    }
