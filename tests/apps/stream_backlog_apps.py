"""Apps that stream far more than a client reads, for tests/worker/test_stream_backlog.py.

Loaded by real workers as ``tests.apps.stream_backlog_apps:NAME``.
"""

from __future__ import annotations

from worker.app import DefaultApp, turn
from worker.ipc.wire import Message, field
from worker.store.session import Session

STREAMED_CHARS = 64_000_000
"""What each App streams for a request whose text is ``flood``: 64 MB of partial output."""


class OneHugeStreamApp(DefaultApp):
    """A ``flood`` request: one stream() call of 64 MB; any other text: a small partial."""

    def handle(self, session: Session, request: Message) -> Message:
        if field(request, "text", str) == "flood":
            turn.stream("x" * STREAMED_CHARS)
        else:
            turn.stream("small")
        return super().handle(session, request)


class ManyStreamsApp(DefaultApp):
    """A ``flood`` request: 320 stream() calls of 200,000 characters; else a small one."""

    def handle(self, session: Session, request: Message) -> Message:
        if field(request, "text", str) == "flood":
            piece = "y" * (STREAMED_CHARS // 320)
            for _ in range(320):
                turn.stream(piece)
        else:
            turn.stream("small")
        return super().handle(session, request)
