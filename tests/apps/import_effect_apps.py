"""Apps whose import does something a template cannot fork safely, or ends the process.

``LOOPD_TEST_AT_IMPORT`` says what, in the template only (its process is named
``loopd-template``), so that a worker that imports the App itself serves normally:

- ``log:PATH``: ``logging.basicConfig(filename=PATH)`` (everywhere, as an App has it);
  the App logs a line per request;
- ``child``: start a process in a session of its own (it escapes a process group);
- ``sysexit``: ``sys.exit(4)``; ``exit``: ``os._exit(3)``;
- ``slow-fork:SECONDS``: every fork the template makes waits SECONDS in the parent
  after it (a template slow to answer, as on a loaded machine).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

from worker.app import DefaultApp, Message, Session

_WHAT, _, _ARG = os.environ.get("LOOPD_TEST_AT_IMPORT", "").partition(":")


def _in_template() -> bool:
    try:
        with open("/proc/self/comm", encoding="utf-8") as comm:
            return comm.read().strip() == "loopd-template"
    except OSError:
        return False


_log = logging.getLogger("import-effect-app")
if _WHAT == "log":
    logging.basicConfig(filename=_ARG, level=logging.INFO, format="%(process)d %(message)s")
elif _in_template():
    if _WHAT == "child":
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)  # import-effect-child"],
            start_new_session=True,
        )
    elif _WHAT == "sysexit":
        sys.exit(4)
    elif _WHAT == "exit":
        os._exit(3)
    elif _WHAT == "slow-fork":
        _template = os.getpid()

        def _slow() -> None:
            if os.getpid() == _template:
                time.sleep(float(_ARG))

        os.register_at_fork(after_in_parent=_slow)


class EffectApp(DefaultApp):
    """The default App, logging each request (``log:`` mode)."""

    def handle(self, session: Session, request: Message) -> Message:
        _log.info("request %s", request.get("text"))
        return super().handle(session, request)
