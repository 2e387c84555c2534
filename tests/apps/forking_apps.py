"""An App that forks a helper, as users' Apps do (``os.fork``, multiprocessing's fork).

Loaded by real workers as ``tests.apps.forking_apps:ForkingApp``. A request's text names how
the helper is made (``os.fork`` or ``multiprocessing``) and, after ``then``, what the
worker does next, the first time only (a retry by key is then answered as usual):
``crash`` exits at once, ``hang`` sleeps in the turn until the test kills the worker.
The helper stands in for a background job: the App writes its pid to ``helper-pids`` in
the home; the helper itself makes ``helper-PID.running`` there once it runs (after the
fork's hooks ran in it), then sleeps long.
"""

from __future__ import annotations

import multiprocessing
import os
import time

from worker.app import DefaultApp
from worker.ipc.wire import Message, field
from worker.store.session import Session

HELPER_SECONDS = 300.0
HANG_SECONDS = 300.0


def _helper(home: str) -> None:
    with open(os.path.join(home, f"helper-{os.getpid()}.running"), "w"):
        pass
    time.sleep(HELPER_SECONDS)


def _fork_helper(how: str, home: str) -> None:
    if how == "multiprocessing":
        process = multiprocessing.get_context("fork").Process(target=_helper, args=(home,))
        process.start()
        pid = process.pid
    else:
        pid = os.fork()
        if pid == 0:  # the helper: never returns into the worker
            try:
                _helper(home)
            finally:
                os._exit(0)
    with open(os.path.join(home, "helper-pids"), "a") as pids:
        pids.write(f"{pid}\n")


class ForkingApp(DefaultApp):
    """The default App, after forking a helper as the request's text says."""

    def handle(self, session: Session, request: Message) -> Message:
        home = os.path.dirname(os.path.dirname(session.dir))
        how, _, then = field(request, "text", str).partition(" then ")
        marker = os.path.join(home, "forked-once")
        if how in ("os.fork", "multiprocessing") and not os.path.exists(marker):
            with open(marker, "w") as file:
                file.write(str(os.getpid()))
            _fork_helper(how, home)
            if then == "crash":
                os._exit(1)
            if then == "hang":
                time.sleep(HANG_SECONDS)
        return super().handle(session, request)
