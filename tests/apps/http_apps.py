"""Apps for tests/http/test_http_api.py, loaded by real workers as ``tests.apps.http_apps:NAME``."""

from __future__ import annotations

import time

from worker.app import DefaultApp, turn
from worker.ipc.wire import Message, field
from worker.store.session import Session

PAUSE = 0.15
"""Seconds between two partials: a client can hang up and come back mid-stream."""


class SlowStreamApp(DefaultApp):
    """Streams each word of the text as a partial, ``PAUSE`` seconds apart, then applies it."""

    def handle(self, session: Session, request: Message) -> Message:
        for index, word in enumerate(field(request, "text", str).split()):
            turn.stream(f"{index}:{word}")
            turn.progress()
            time.sleep(PAUSE)  # the model thinking between two tokens
        return super().handle(session, request)
