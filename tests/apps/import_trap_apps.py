"""An App whose module starts a client thread at import, as an SDK's client may.

A process forked after the import has the client object but not its thread: a request
then waits for an answer that never comes. ``serve`` imports an App in each worker, so
the thread is there; the rig must load the App the same way, or it fails an App that
``serve`` hosts (or, with a template process, passes one that ``serve`` fails).
"""

from __future__ import annotations

import queue
import threading
from typing import Final

from worker.app import DefaultApp, Message, Session, SessionError

ANSWER_WITHIN: Final = 10.0
_asks: queue.Queue[tuple[str, queue.Queue[str]]] = queue.Queue()


def _client() -> None:
    while True:
        text, answer = _asks.get()
        answer.put(text.upper())


threading.Thread(target=_client, name="import-time client", daemon=True).start()


def _ask(text: str) -> str:
    answer: queue.Queue[str] = queue.Queue()
    _asks.put((text, answer))
    try:
        return answer.get(timeout=ANSWER_WITHIN)
    except queue.Empty:
        raise RuntimeError(
            "the client created at import does not answer: its thread is gone"
        ) from None


class ThreadAtImportApp(DefaultApp):
    """The default App, asking the import-time client first at every request."""

    def handle(self, session: Session, request: Message) -> Message:
        _ask(str(request.get("text", "")))
        return super().handle(session, request)

    def handle_many(
        self, session: Session, requests: list[Message]
    ) -> list[Message | SessionError]:
        for request in requests:
            _ask(str(request.get("text", "")))
        return super().handle_many(session, requests)
