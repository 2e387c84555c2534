"""Apps for the connection and hibernation edge tests, loaded as ``tests.apps.edge_apps:NAME``."""

from __future__ import annotations

import os
import time

from worker.app import DefaultApp
from worker.ipc.wire import Message, field, optional_field
from worker.store.session import Session


class SlowApp(DefaultApp):
    """The default app; a new request ``sleep S`` first takes S seconds (a slow request).

    Before sleeping it writes ``<home>/sleeping-<pid>`` (holding the key), so a test knows
    the worker is in the middle of the request. A key already applied is answered from
    the log at once.
    """

    def handle(self, session: Session, request: Message) -> Message:
        text = field(request, "text", str)
        key = optional_field(request, "key", str)
        if text.startswith("sleep ") and not (key and session.find_key(key)):
            home = os.path.dirname(os.path.dirname(session.dir))
            with open(os.path.join(home, f"sleeping-{os.getpid()}"), "w") as marker:
                marker.write(key or "")
            time.sleep(float(text.split()[1]))
        return super().handle(session, request)


class BigReplyApp(DefaultApp):
    """The default app; ``reply N`` is applied as usual and answered with N bytes of text."""

    def handle(self, session: Session, request: Message) -> Message:
        result = super().handle(session, request)
        text = field(request, "text", str)
        if text.startswith("reply ") and not result.get("duplicate"):
            result["text"] = "x" * int(text.split()[1])
        return result
