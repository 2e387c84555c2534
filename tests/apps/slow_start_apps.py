"""An App whose factory fails after a slow start, as one importing a heavy SDK may."""

from __future__ import annotations

import os
import threading
import time

from worker.app import DefaultApp

SLOW_START_ENV = "LOOPD_TEST_SLOW_START"
REASON = "the model endpoint is not configured"


def slow_failing_app(budget: int) -> DefaultApp:
    """Takes ``$LOOPD_TEST_SLOW_START`` seconds, then raises: no start ever reaches ready."""
    time.sleep(float(os.environ.get(SLOW_START_ENV, "2")))  # the start's own cost, not a wait
    raise RuntimeError(REASON)


def never_ready_app(budget: int) -> DefaultApp:
    """A factory that never returns (a client waiting on a server that never answers)."""
    del budget
    threading.Event().wait()  # for ever: the start deadline must end it
    raise AssertionError("unreachable")
