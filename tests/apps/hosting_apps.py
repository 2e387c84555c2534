"""Apps for the hosting tests, loaded by real workers as ``tests.apps.hosting_apps:NAME``."""

from __future__ import annotations

import sys

from worker.app import DefaultApp
from worker.ipc.wire import Message, field, optional_field
from worker.store.session import Session

_HOARD: list[bytes] = []


class AllocatingApp(DefaultApp):
    """The default app; a new text ``grow N`` first keeps N MiB of touched memory alive."""

    def handle(self, session: Session, request: Message) -> Message:
        text = field(request, "text", str)
        key = optional_field(request, "key", str)
        if text.startswith("grow ") and not (key and session.find_key(key)):
            mib = int(text.split()[1])
            _HOARD.extend(b"\x01" * (1 << 20) for _ in range(mib))  # touched pages: RSS
        return super().handle(session, request)


class ChattyApp(DefaultApp):
    """The default app that also prints each request's text on stdout and stderr."""

    def handle(self, session: Session, request: Message) -> Message:
        text = field(request, "text", str)
        print(f"out: {text}", flush=True)
        print(f"err: {text}", file=sys.stderr, flush=True)
        return super().handle(session, request)
