"""Apps for the operator-command tests, loaded by real workers as ``tests.ops_apps:NAME``."""

from __future__ import annotations

import os
import time

from worker.app import DefaultApp

START_SECONDS = 0.3
"""How long a SlowStartApp's worker takes to come up: long enough that two restarts
asked for together are both under way before either is serving again."""


class SlowStartApp(DefaultApp):
    """The default app, whose worker takes START_SECONDS to be ready (a warm-up)."""

    def __init__(self, budget: int) -> None:
        time.sleep(START_SECONDS)
        super().__init__(budget)


class FragileApp(DefaultApp):
    """The default app, which cannot start while the file ``$LOOPD_TEST_BROKEN`` exists
    (a deploy that broke this App)."""

    def __init__(self, budget: int) -> None:
        marker = os.environ.get("LOOPD_TEST_BROKEN", "")
        if marker and os.path.exists(marker):
            raise RuntimeError(f"broken by the deploy ({marker} exists)")
        super().__init__(budget)


class StallingApp(DefaultApp):
    """The default app, whose worker takes 5 s to start while ``$LOOPD_TEST_STALL`` exists."""

    def __init__(self, budget: int) -> None:
        marker = os.environ.get("LOOPD_TEST_STALL", "")
        if marker and os.path.exists(marker):
            time.sleep(5)
        super().__init__(budget)
