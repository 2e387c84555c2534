"""The App of the rig's ``streaming`` scenario: the default app, streaming each reply.

Every request it applies afresh streams its reply (``echo: TEXT``, the default app's)
in ``PIECES`` partials, in order, naming the request (``stream(text, request=...)``),
as a model's tokens are streamed before the turn is written. A request answered from
the log (a retry, a key applied before) runs no turn and streams nothing. What it
streams is a function of the request's text alone, so the rig's client knows what
each request's partials must be (``chaos.oracle.batch_checks``).
"""

from __future__ import annotations

from typing import Final

from worker.app import DefaultApp, Message, Session, SessionError, stream

PIECES: Final = 3


def pieces(text: str) -> list[str]:
    """The partials the App streams for a request of ``text``: its reply, cut in order."""
    reply = f"echo: {text}"
    size = -(-len(reply) // PIECES)
    return [reply[start : start + size] for start in range(0, len(reply), size)]


class StreamingApp(DefaultApp):
    """The default app whose turns stream their reply before the group commit."""

    def handle_many(
        self, session: Session, requests: list[Message]
    ) -> list[Message | SessionError]:
        streamed: set[str] = set()
        for request in requests:
            key, text = request.get("key"), request.get("text")
            if not isinstance(key, str) or not isinstance(text, str) or key in streamed:
                continue  # an ill-formed request gets its error from the default app
            streamed.add(key)
            try:
                if session.find_key(key) is not None:
                    continue  # answered from the log: no turn, no partials
            except SessionError:
                continue  # the default app answers it with this error
            for piece in pieces(text):
                stream(piece, request=request)
        return super().handle_many(session, requests)
