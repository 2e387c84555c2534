"""Apps for the side-job tests, loaded by real workers as ``tests.apps.side_job_apps:NAME``."""

from __future__ import annotations

from worker.app import DefaultApp

LOUD_REASON = "€" * 3000
"""Cut by the worker to its report limit: some 6 KB of UTF-8 in each session's last error."""


def loud_crash_app(budget: int) -> DefaultApp:
    """An app factory that fails at every start with a long reason (a long last_error)."""
    raise RuntimeError(LOUD_REASON)
