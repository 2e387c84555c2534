"""Apps the rig's worker-level scenarios host (loaded by the worker as module:attribute)."""

from __future__ import annotations

import os

from worker.app import DefaultApp
from worker.store.session import Session


class UnrepeatableSummaryApp(DefaultApp):
    """The default app, whose summary of an epoch is never the same twice.

    A real app summarizes with a model that does not answer twice alike; a resume that
    recomputes the summary instead of using the recorded one is then caught.
    """

    def summarize(self, session: Session) -> str:
        return f"{super().summarize(session)} [{os.urandom(4).hex()}]"
