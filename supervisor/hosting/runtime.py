"""The hosting features inside the daemon's loop: events, metrics, logs, hibernation,
memory caps and systemd, fed by the hosted sessions' state changes and reports.

Everything here runs in the daemon's one asyncio loop: worker output arrives through
``add_reader`` on a non-blocking pipe (worker_logs.py), the idle check is one timer for the least
recently used session, the RSS check is one slow timer plus a look at each report.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Final

from supervisor.errors import ServeError
from supervisor.hosting.daemon_output import DaemonOutput
from supervisor.hosting.events import Event, EventHub, app_changed_event
from supervisor.hosting.hibernation import Hibernation
from supervisor.hosting.intent import IntentError, IntentFile
from supervisor.hosting.metrics.daemon_metrics import DEFAULT_APP_LABEL, DaemonMetrics
from supervisor.hosting.metrics.metrics_http import (
    ScrapeGate,
    TokenError,
    read_token,
    serve_metrics,
)
from supervisor.hosting.metrics.rss_cache import MeasuredWorker, RssCache
from supervisor.hosting.sd_notify import Notifier
from supervisor.hosting.session_actions import Hosted, hibernate, restart_for_memory
from supervisor.hosting.settings import HostingSettings
from supervisor.hosting.worker_logs import WorkerLogs
from supervisor.scheduling.timers import ScheduleTimers
from supervisor.states import State

_LIVE: Final = frozenset({State.STARTING, State.RUNNING, State.STOPPING})
RSS_SAMPLE_GAP: Final = 1.0
"""Seconds between two RSS samples of one worker taken at its reports."""
STATUS_GAP: Final = 2.0
"""Seconds between two STATUS= lines to systemd."""


class Hosting:
    """One per daemon: receives state changes and reports, runs the hosting timers."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        home: str,
        settings: HostingSettings,
        sessions: Mapping[str, Hosted],
        report: Callable[[str], None],
        notifier: Notifier | None = None,
    ) -> None:
        self.loop = loop
        self.home = home
        self.settings = settings
        self.sessions = sessions
        self.report = report
        # The daemon's own lines (report) go here: never blocking, dropped when unread.
        self.output = DaemonOutput(loop)
        loop.set_exception_handler(self._loop_exception)
        self.notifier = notifier or Notifier.from_environ(report=report)
        self.intent = IntentFile(home)
        self.events = EventHub(report, loop.call_later)
        self.hibernation = Hibernation(
            loop, sessions, self._hibernate, idle_stop=settings.idle_stop,
            max_live=settings.max_live,
        )  # fmt: skip
        self.rss = RssCache(loop, self._live_workers)
        self.scrapes = ScrapeGate()
        self.metrics = DaemonMetrics(
            lambda: (h.state.value for h in sessions.values()),
            self.rss.figures,
            [s.value for s in State],
            live_workers=lambda: sum(1 for _ in self._live_workers()),
            rss_reads=lambda: self.rss.reads,
        )
        self._exits: dict[str, tuple[int, int]] = {}  # session -> (pid, code) of its last exit
        self.logs = WorkerLogs(loop, home, settings, report)
        self.timers = ScheduleTimers(loop, home, sessions, report)  # scheduled requests
        self._requests: dict[str, int] = {}
        self._why: dict[str, str] = {}
        self._capped: set[int] = set()  # workers killed for their RSS, not yet reaped
        self._sampled: dict[str, float] = {}
        self._epochs: dict[str, int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._metrics_server: asyncio.Server | None = None
        self._ready_sent = False
        self._last_status = 0.0

    # -- lifecycle of the daemon ---------------------------------------------------------

    def initial_states(self, sessions: list[str]) -> dict[str, State | None]:
        """How each session found at start is hosted: STOPPED if an operator stopped it,
        IDLE when hibernation is on, None to start it now. ServeError if the intent file
        cannot be read."""
        try:
            stopped = self.intent.load()
        except IntentError as exc:
            raise ServeError(f"{exc}; fix or remove it (it lists the stopped sessions)") from exc
        resting = State.IDLE if self.settings.hibernates else None
        return {s: State.STOPPED if s in stopped else resting for s in sessions}

    def open_metrics(self) -> None:
        """Listen for scrapes at ``--metrics-listen`` (before the loop runs)."""
        listen = self.settings.metrics_listen
        token_file = self.settings.metrics_token_file
        if listen is None:
            if token_file is not None:
                raise ServeError("--metrics-token-file needs --metrics-listen")
            return
        if token_file is not None:
            try:
                self.scrapes.token = read_token(token_file)
            except TokenError as exc:
                raise ServeError(f"--metrics-token-file {exc}") from exc
        try:
            self._metrics_server = self.loop.run_until_complete(
                serve_metrics(self.loop, listen, self.metrics.render, self.scrapes)
            )
        except (OSError, ValueError) as exc:
            raise ServeError(f"--metrics-listen {listen}: {exc}") from exc
        if token_file is None:
            self.report(f"metrics at {listen} without --metrics-token-file: anyone who can "
                        "reach it may scrape")  # fmt: skip

    def begin(self) -> None:
        """Start the slow timers and the schedules' (after the socket listens)."""
        self.timers.begin()
        interval = self.notifier.watchdog_interval()
        if interval is not None:
            self._every("watchdog", interval, self.notifier.watchdog)
        if self.settings.max_rss_mb is not None:
            self._every("rss", self.settings.rss_check_interval, self._check_all_rss)

    def all_started(self) -> None:
        """Every existing session has been started or hibernated: READY=1, once."""
        if not self._ready_sent:
            self._ready_sent = True
            self.notifier.ready(self.summary())

    def stopping(self) -> None:
        self.hibernation.stopping()
        self.notifier.stopping("stopping every worker")

    def close(self) -> None:
        if self._metrics_server is not None:
            self._metrics_server.close()
        for timer in self._timers.values():
            timer.cancel()
        self.timers.close()
        self.hibernation.close()
        self.logs.close()
        self.notifier.close()
        self.output.close()

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for hosted in self.sessions.values():
            counts[hosted.state.value] = counts.get(hosted.state.value, 0) + 1
        shown = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items()))
        return f"{len(self.sessions)} sessions" + (f": {shown}" if shown else "")

    # -- state changes -------------------------------------------------------------------

    def on_move(self, hosted: Hosted, old: State, new: State, reason: str = "") -> None:
        self.metrics.events += 1
        if new is State.BACKOFF:
            self.metrics.restarts += 1
        elif new is State.IDLE:
            self.metrics.hibernations += 1
        elif new is State.STARTING and old is State.IDLE:
            self.metrics.wakeups += 1
        worker = hosted.worker
        pid = worker.pid if worker is not None else None
        exit_code = signal = None
        if worker is None and old in _LIVE and hosted.exit_code is not None:
            pid, code = hosted.exit_pid, hosted.exit_code  # this move follows a reaped exit
            exit_code, signal = (None, -code) if code < 0 else (code, None)
            if pid is not None:
                # Kept for on_exit's log line: an immediate restart clears the session's
                # exit code before that line is written.
                self._exits[hosted.id] = (pid, code)
        reason = reason or self._why.get(hosted.id) or _reason(old, new, hosted.last_error)
        self.events.publish(
            Event(session=hosted.id, from_state=old.value, to_state=new.value, reason=reason,
                  pid=pid, exit_code=exit_code, signal=signal)
        )  # fmt: skip
        if new is State.RUNNING and hosted.epoch is not None:
            self._epochs[hosted.id] = hosted.epoch  # as opened: later changes count
        self.hibernation.on_move(hosted, old, new)
        self.timers.on_move(hosted, old, new)
        now = time.monotonic()
        if self._ready_sent and now - self._last_status >= STATUS_GAP:
            self._last_status = now
            self.notifier.status(self.summary())

    def on_exit(self, hosted: Hosted, pid: int, code: int) -> None:
        """A worker was reaped: its counters join the totals, its log notes the exit."""
        self.metrics.on_worker_gone(hosted.id)
        self._requests.pop(hosted.id, None)
        self._sampled.pop(hosted.id, None)
        self._capped.discard(pid)
        self.rss.forget(pid)
        exited = self._exits.pop(hosted.id, None)
        if exited is not None and exited[0] == pid:
            code = exited[1]
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        self.logs.note_exit(hosted.id, f"worker {pid} {how}")

    def on_report(self, hosted: Hosted, message: Mapping[str, object]) -> None:
        """A worker's state report (after requests) carried its state and counters."""
        self.timers.on_report(hosted, message)
        stats = message.get("stats")
        if isinstance(stats, dict):
            self.metrics.on_report(hosted.id, stats, hosted.app or DEFAULT_APP_LABEL)
            requests = stats.get("requests")
            if isinstance(requests, int) and requests != self._requests.get(hosted.id):
                self._requests[hosted.id] = requests
                self.hibernation.served(hosted.id)
                self._sample_rss(hosted)
        changed = message.get("app_changed")
        if isinstance(changed, dict):
            self.events.publish(app_changed_event(hosted.id, hosted.state.value, changed))
        state = message.get("state")
        epoch = state.get("epoch") if isinstance(state, dict) else None
        if isinstance(epoch, int):
            before = self._epochs.get(hosted.id)
            if before is not None and epoch > before:
                self.metrics.epoch_changes += epoch - before
            self._epochs[hosted.id] = epoch

    # -- worker output -------------------------------------------------------------------

    def watch_output(self, session: str, pid: int, fd: int) -> None:
        """Read a worker's stdout and stderr (one pipe) into its log file."""
        self.logs.watch(session, pid, fd)

    # -- hibernation ---------------------------------------------------------------------

    def wake(self, hosted: Hosted) -> None:
        """A request wants an IDLE session: it starts now, or when --max-live has room."""
        self.hibernation.wake(hosted)

    def _hibernate(self, session: str, why: str) -> None:
        self._why[session] = why  # the reason of the STOPPING move that follows
        hibernate(self.sessions[session])
        self._why.pop(session, None)

    # -- memory caps -----------------------------------------------------------------------

    def _sample_rss(self, hosted: Hosted) -> None:
        if self.settings.max_rss_mb is None:
            return
        now = time.monotonic()
        if now - self._sampled.get(hosted.id, 0.0) < RSS_SAMPLE_GAP:
            return
        self._sampled[hosted.id] = now
        self._check_rss(hosted)

    def _check_all_rss(self) -> None:
        for hosted in list(self.sessions.values()):
            if hosted.state is State.RUNNING:
                self._check_rss(hosted)

    def _check_rss(self, hosted: Hosted) -> None:
        limit = self.settings.max_rss_mb
        worker = hosted.worker
        if limit is None or worker is None or worker.pid in self._capped:
            return
        rss = worker.rss_bytes()
        if rss is not None:
            self.rss.store(worker.pid, rss)
        if rss is not None and rss > limit * 2**20:
            self.metrics.memory_restarts += 1
            self._capped.add(worker.pid)
            restart_for_memory(
                hosted, f"rss {rss / 2**20:.0f} MiB past --max-rss {limit} MiB: restarted"
            )

    # -- helpers ---------------------------------------------------------------------------

    def _live_workers(self) -> Iterator[MeasuredWorker]:
        for hosted in self.sessions.values():
            if hosted.worker is not None:
                yield hosted.worker

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        """What asyncio would log (a failed accept, a callback's exception), as one line of
        the daemon's own output, which never blocks."""
        exc = context.get("exception")
        where = f": {type(exc).__name__}: {exc}" if isinstance(exc, BaseException) else ""
        self.report(f"{context.get('message', 'error in the loop')}{where}")

    def _every(self, name: str, interval: float, action: Callable[[], object]) -> None:
        def tick() -> None:
            action()
            self._timers[name] = self.loop.call_later(interval, tick)

        self._timers[name] = self.loop.call_later(interval, tick)


def _reason(old: State, new: State, last_error: str | None) -> str:
    if new in (State.BACKOFF, State.FATAL) and last_error:
        return last_error
    return {
        State.STARTING: "woken by a request" if old is State.IDLE else "starting",
        State.RUNNING: "ready",
        State.STOPPING: "stopping",
        State.STOPPED: "stopped",
        State.IDLE: "hibernated",
        State.EXITED: "worker exited by itself",
    }.get(new, "")
