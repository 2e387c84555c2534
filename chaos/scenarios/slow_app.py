"""The rig's slow App: turns that take time, a tool loop that reports progress, and a
request that hangs past its deadline (the ``slow`` scenario and its ``poison`` probe).

A request's text says what its turn does, before the default app applies it:

- ``loop ...``: a tool loop of ``LOOP_STEPS`` steps of ``LOOP_STEP`` seconds, calling
  ``worker.app.turn.progress()`` after each: longer in all than the worker's deadline, never
  longer than it between two progress calls. Its tool's result is cached beside the home
  after the first loop of a key (a marker file), so a retry of it is quick, as a retried
  turn that finds a cached model answer is.
- ``hang ...``: sleeps ``HANG`` seconds without progress, several deadlines: a stuck
  model call. SIGALRM must end it first.
- anything else: ``TURN`` seconds.

It is a ``handle_many`` App, so the worker hands it pipelined requests in chunks.
"""

from __future__ import annotations

import os
import time
from typing import Final

from worker.app import DefaultApp, turn
from worker.ipc.wire import Message, field, optional_field
from worker.store.errors import SessionError
from worker.store.session import Session

TURN: Final = 0.004
LOOP_STEPS: Final = 8
LOOP_STEP: Final = 0.025
HANG: Final = 0.6


def _case_root(session: Session) -> str:
    """The directory the case's home is in (home/sessions/<id> is the session's)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(session.dir))))


class SlowTurnsApp(DefaultApp):
    """The default app, each request slowed as its text says (module docstring)."""

    def handle_many(
        self, session: Session, requests: list[Message]
    ) -> list[Message | SessionError]:
        for request in requests:
            text = field(request, "text", str)
            if text.startswith("hang "):
                time.sleep(HANG)
            elif text.startswith("loop "):
                self._tool_loop(session, optional_field(request, "key", str) or text)
            else:
                time.sleep(TURN)
        return super().handle_many(session, requests)

    def _tool_loop(self, session: Session, key: str) -> None:
        marker = os.path.join(_case_root(session), f"slow-loop-{key}")
        if os.path.exists(marker):
            return  # the tool's result was cached by an earlier attempt
        with open(marker, "w", encoding="utf-8") as file:
            file.write(str(os.getpid()))
        for _ in range(LOOP_STEPS):
            time.sleep(LOOP_STEP)
            turn.progress()


def slow_turns_app(budget: int) -> SlowTurnsApp:
    """The factory ``--app chaos.scenarios.slow_app:slow_turns_app`` names."""
    return SlowTurnsApp(budget)
