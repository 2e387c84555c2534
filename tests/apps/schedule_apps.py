"""Apps that schedule requests while they handle one (worker.app.turn.schedule), for tests.

``remind SECONDS KEY TEXT`` schedules ``TEXT`` under ``KEY`` for SECONDS from now and is
answered as the echo app answers; ``remind-bad ...`` schedules with a time without a
zone (refused: the App's error); every other text is the echo app's.
"""

from __future__ import annotations

import datetime

from worker.app import DefaultApp, Message, Session, turn


class RemindingApp(DefaultApp):
    """The echo app, plus ``remind SECONDS KEY TEXT``."""

    def handle(self, session: Session, request: Message) -> Message:
        text = request.get("text")
        if isinstance(text, str) and text.startswith("remind "):
            _word, seconds, key, rest = text.split(" ", 3)
            now = datetime.datetime.now(datetime.UTC)
            turn.schedule(now + datetime.timedelta(seconds=float(seconds)), rest, key=key)
        return super().handle(session, request)
