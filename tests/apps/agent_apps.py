"""Agent Apps for the agent tests, loaded by real workers as ``tests.apps.agent_apps:NAME``."""

from __future__ import annotations

import os
import signal
from typing import Final

from examples.agent_app import AgentApp, TurnObserver, _Turn
from worker.store.session import Session

DEATH_MARKER_ENV: Final = "AGENT_TEST_DEATH_MARKER"


class ToolsThenDeathAgent(AgentApp):
    """The agent, whose worker SIGKILLs itself once: after a turn's tools ran, before the
    turn is written (the marker file, named by the environment, says it happened)."""

    def _run_turn(
        self, session: Session, text: str, key: str | None, untrusted: bool, observer: TurnObserver
    ) -> _Turn:
        turn = super()._run_turn(session, text, key, untrusted, observer)
        try:
            fd = os.open(os.environ[DEATH_MARKER_ENV], os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return turn  # died once already: this is the retry
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("SIGKILL returned")
