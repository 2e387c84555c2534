"""An agent whose tools lose the request's key: its notes carry no Idempotency-Key.

The chaos rig must catch it by ``app-effects-once-per-key`` where the good agent
(``examples.agent_app:with_fake_model``) passes the same case.
"""

from __future__ import annotations

from examples.agent_app import AgentApp, TurnObserver, _Turn, with_fake_model
from worker.app import Session


class KeylessToolsAgent(AgentApp):
    """Runs each turn's tools as if the turn had no key: ``post_note`` sends none."""

    def _run_turn(
        self, session: Session, text: str, key: str | None, untrusted: bool, observer: TurnObserver
    ) -> _Turn:
        return super()._run_turn(session, text, None, untrusted, observer)


def keyless_tools_agent(budget: int) -> KeylessToolsAgent:
    """The agent against its fake model, under the rig, with keyless tools."""
    good = with_fake_model(budget)
    return KeylessToolsAgent(budget, good.config)
