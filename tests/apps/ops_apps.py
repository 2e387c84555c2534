"""Apps for the operator-command and client tests, loaded by real workers as
``tests.apps.ops_apps:NAME``."""

from __future__ import annotations

import os
import signal
import time

from worker.app import DefaultApp
from worker.ipc.wire import Message, field
from worker.store.session import Session

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


class DiesOnDieApp(DefaultApp):
    """The default app, whose worker SIGKILLs itself on the text ``die``: once per home
    (a marker file remembers it), or every time with ``$LOOPD_TEST_DIE_ALWAYS``."""

    def handle(self, session: Session, request: Message) -> Message:
        if field(request, "text", str) == "die":
            marker = os.path.join(os.path.dirname(os.path.dirname(session.dir)), "died")
            if os.environ.get("LOOPD_TEST_DIE_ALWAYS") or not os.path.exists(marker):
                with open(marker, "a"):
                    pass
                os.kill(os.getpid(), signal.SIGKILL)
        return super().handle(session, request)


class SlowTurnApp(DefaultApp):
    """The default app, whose turn on the text ``slow`` takes 3 s; it first creates the
    file ``$LOOPD_TEST_TURN`` so a test knows the turn is under way."""

    def handle(self, session: Session, request: Message) -> Message:
        if field(request, "text", str) == "slow":
            with open(os.environ["LOOPD_TEST_TURN"], "a"):
                pass
            time.sleep(3)
        return super().handle(session, request)
