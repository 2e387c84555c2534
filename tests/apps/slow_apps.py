"""Apps as users host them, for tests: slow turns, progress, streaming, a poison request.

Loaded by real workers as ``tests.apps.slow_apps:NAME``. The seconds a turn takes come from
``LOOPD_TEST_TURN_SECONDS`` (a slow model call stands in as a sleep inside the App: the
App is what is slow, not the test waiting for it).
"""

from __future__ import annotations

import os
import signal
import time

from worker.app import DefaultApp, turn
from worker.ipc.wire import Message, field
from worker.store.errors import SessionError
from worker.store.session import Session


def _turn_seconds() -> float:
    return float(os.environ.get("LOOPD_TEST_TURN_SECONDS", "1"))


class SlowTurnApp(DefaultApp):
    """The default app, but each request takes LOOPD_TEST_TURN_SECONDS (no progress calls)."""

    def handle(self, session: Session, request: Message) -> Message:
        time.sleep(_turn_seconds())
        return super().handle(session, request)


class ProgressApp(DefaultApp):
    """A long tool loop: LOOPD_TEST_TURN_SECONDS of one-second steps, progress after each."""

    def handle(self, session: Session, request: Message) -> Message:
        home = os.path.dirname(os.path.dirname(session.dir))
        with open(os.path.join(home, f"turn-{os.getpid()}"), "w") as marker:
            marker.write(field(request, "text", str))  # a test may act once a turn runs
        deadline = time.monotonic() + _turn_seconds()
        while time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            turn.progress()
        return super().handle(session, request)


class SlowBatchApp(DefaultApp):
    """A handle_many App whose every request takes LOOPD_TEST_TURN_SECONDS (one group commit)."""

    def handle_many(
        self, session: Session, requests: list[Message]
    ) -> list[Message | SessionError]:
        time.sleep(_turn_seconds() * len(requests))
        return super().handle_many(session, requests)


class PoisonApp(DefaultApp):
    """The default app, except that a request whose text is ``poison`` kills its worker."""

    def handle(self, session: Session, request: Message) -> Message:
        if field(request, "text", str) == "poison":
            os.kill(os.getpid(), signal.SIGKILL)
        return super().handle(session, request)


class StreamingApp(DefaultApp):
    """Streams each word of the text as a partial, then applies the request."""

    def handle(self, session: Session, request: Message) -> Message:
        for index, word in enumerate(field(request, "text", str).split()):
            turn.stream(f"{index}:{word}")
            turn.progress()
        return super().handle(session, request)


class DyingStreamApp(DefaultApp):
    """Streams two partials, then, the first time only, dies before applying anything."""

    def handle(self, session: Session, request: Message) -> Message:
        turn.stream("first")
        turn.stream("second")
        home = os.path.dirname(os.path.dirname(session.dir))
        marker = os.path.join(home, "died-once")
        if not os.path.exists(marker):
            with open(marker, "w") as file:
                file.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return super().handle(session, request)


class RaisingApp(DefaultApp):
    """The default app, except that ``raise`` raises RuntimeError and ``reset`` raises
    ConnectionResetError (as an App whose model server hung up would)."""

    def handle(self, session: Session, request: Message) -> Message:
        text = field(request, "text", str)
        if text == "raise":
            raise RuntimeError("the App failed")
        if text == "reset":
            raise ConnectionResetError("the model server reset the connection")
        return super().handle(session, request)


class HugePartialApp(DefaultApp):
    """Streams one partial of 1.5 million characters, then applies the request."""

    def handle(self, session: Session, request: Message) -> Message:
        turn.stream("x" * 1_500_000)
        return super().handle(session, request)
