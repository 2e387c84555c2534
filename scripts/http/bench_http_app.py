"""The App of ``scripts.http.bench_http``: ``--app scripts.http.bench_http_app:TickApp``."""

from __future__ import annotations

import time

from worker.app import DefaultApp, turn
from worker.ipc.wire import Message, field
from worker.store.session import Session


class TickApp(DefaultApp):
    """``ticks N pause S``: N partials, each ``"<i> <monotonic ns at stream()>"``, S
    seconds apart; then the default App's reply. Any other text: the default App."""

    def handle(self, session: Session, request: Message) -> Message:
        words = field(request, "text", str).split()
        if len(words) == 4 and words[0] == "ticks" and words[2] == "pause":
            for index in range(int(words[1])):
                if index:
                    time.sleep(float(words[3]))
                turn.stream(f"{index} {time.monotonic_ns()}")
                turn.progress()
        return super().handle(session, request)
