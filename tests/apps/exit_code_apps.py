"""An App that ends its own worker with a chosen exit code (``exit N``), as an App's
``os._exit`` or a C library's ``exit()`` may."""

from __future__ import annotations

import os

from worker.app import DefaultApp, Message, Session


class ExitingApp(DefaultApp):
    """The default App; a request ``exit N`` ends the worker with code N at once."""

    def handle(self, session: Session, request: Message) -> Message:
        text = str(request.get("text", ""))
        if text.startswith("exit "):
            os._exit(int(text.split()[1]))
        return super().handle(session, request)
