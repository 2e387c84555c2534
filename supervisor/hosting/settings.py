"""The hosting settings of ``loopd serve`` and the flags that set them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeVar

import click

from supervisor.hosting.bounds import seconds
from supervisor.hosting.session_log import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES, MAX_BACKUPS

F = TypeVar("F", bound=Callable[..., object])
RSS_CHECK_INTERVAL: Final = 10.0
"""Seconds between the slow timer's looks at live workers' RSS (besides each report)."""
MAX_LIVE: Final = 1_000_000
MAX_LOG_BYTES: Final = 1 << 30
MAX_RSS_MB: Final = 1 << 22
"""4 TiB: a worker's RSS cap beyond any machine's memory is a typo."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HostingSettings:
    """Hibernation, logs, metrics and memory caps of one ``loopd serve``."""

    idle_stop: float | None = None
    max_live: int | None = None
    log_max_bytes: int = DEFAULT_MAX_BYTES
    log_backups: int = DEFAULT_BACKUPS
    metrics_listen: str | None = None
    metrics_token_file: str | None = None
    max_rss_mb: int | None = None
    rss_check_interval: float = RSS_CHECK_INTERVAL

    @property
    def hibernates(self) -> bool:
        """Sessions start hibernated and wake on demand (either limit is set)."""
        return self.idle_stop is not None or self.max_live is not None


_OPTIONS: Final = (
    click.option("--idle-stop", type=seconds(0.1), default=None,
                 help="stop a session's worker after this many seconds without a request "
                 "(state IDLE); the next request starts it again."),
    click.option("--max-live", type=click.IntRange(1, MAX_LIVE), default=None,
                 help="at most this many live workers: the least recently used make room."),
    click.option("--log-max-bytes", type=click.IntRange(1024, MAX_LOG_BYTES),
                 default=DEFAULT_MAX_BYTES, show_default=True,
                 help="rotate <home>/logs/<id>.log past this size."),
    click.option("--log-backups", type=click.IntRange(0, MAX_BACKUPS), default=DEFAULT_BACKUPS,
                 show_default=True,
                 help="rotated logs kept per session (<id>.log.N, the highest the newest)."),
    click.option("--metrics-listen", default=None, metavar="HOST:PORT",
                 help="serve the Prometheus exposition over HTTP at HOST:PORT/metrics."),
    click.option("--metrics-token-file", default=None, metavar="PATH",
                 help="scrapes must send 'Authorization: Bearer <the token in PATH>' "
                 "(a file of mode 0600); without it anyone who reaches HOST:PORT may scrape."),
    click.option("--max-rss", "max_rss_mb", type=click.IntRange(1, MAX_RSS_MB), default=None,
                 metavar="MB", help="restart a worker whose RSS grows past this many MiB."),
    click.option("--rss-check-interval", type=seconds(0.1),
                 default=RSS_CHECK_INTERVAL, show_default=True,
                 help="seconds between looks at live workers' RSS when --max-rss is set."),
)  # fmt: skip


def hosting_options(command: F) -> F:
    """Add the hosting flags to a click command."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def settings_from(params: dict[str, object]) -> HostingSettings:
    """The hosting settings among a command's parameters (removed from ``params``)."""
    idle_stop = params.pop("idle_stop")
    max_live = params.pop("max_live")
    log_max_bytes = params.pop("log_max_bytes")
    log_backups = params.pop("log_backups")
    metrics_listen = params.pop("metrics_listen")
    token_file = params.pop("metrics_token_file")
    max_rss_mb = params.pop("max_rss_mb")
    interval = params.pop("rss_check_interval")
    return HostingSettings(
        idle_stop=float(idle_stop) if isinstance(idle_stop, int | float) else None,
        max_live=max_live if isinstance(max_live, int) else None,
        log_max_bytes=log_max_bytes if isinstance(log_max_bytes, int) else DEFAULT_MAX_BYTES,
        log_backups=log_backups if isinstance(log_backups, int) else DEFAULT_BACKUPS,
        metrics_listen=metrics_listen if isinstance(metrics_listen, str) else None,
        metrics_token_file=token_file if isinstance(token_file, str) else None,
        max_rss_mb=max_rss_mb if isinstance(max_rss_mb, int) else None,
        rss_check_interval=float(interval) if isinstance(interval, int | float) else 10.0,
    )
