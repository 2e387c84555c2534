"""Apps for the template tests: one whose import is heavy and counted, one that stops
importing when a file appears.

``LOOPD_TEST_IMPORTS`` names a file each import of this module appends its process's
pid to: a worker forked from its App's template never appears there; one that imported
the App itself does.
"""

from __future__ import annotations

import os
from pathlib import Path

# Genuinely heavy, and installed wherever the tests run (a test dependency): what an
# SDK costs at import, without sleeping.
import hypothesis
import hypothesis.strategies

from worker.app import DefaultApp, Message, Session

_imports = os.environ.get("LOOPD_TEST_IMPORTS")
if _imports:
    with open(_imports, "a", encoding="utf-8") as counter:
        counter.write(f"{os.getpid()}\n")

_broken = os.environ.get("LOOPD_TEST_BROKEN")
if _broken and Path(_broken).exists():
    raise RuntimeError(f"this App no longer imports: {_broken} exists")

HYPOTHESIS_VERSION = hypothesis.__version__
_TEXTS = hypothesis.strategies.text()


class HeavyApp(DefaultApp):
    """The default App, answering with the heavy module's version as well."""

    def handle(self, session: Session, request: Message) -> Message:
        reply = super().handle(session, request)
        return {**reply, "heavy": HYPOTHESIS_VERSION}
