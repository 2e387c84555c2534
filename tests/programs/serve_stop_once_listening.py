"""``loopd serve`` that stops itself (SIGSTOP) once its control socket listens, before it
arms its timers and runs its loop.

Run as ``python -m tests.programs.serve_stop_once_listening serve ...``. A test can then
connect and send requests, which wait in the socket, and resume the daemon with SIGCONT:
those requests are read in the first turns of its loop, among whatever it does at start
(the catch-up of the schedules that came due while no daemon ran).
"""

from __future__ import annotations

import os
import signal

from supervisor.cli.group import main
from supervisor.daemon.listener import Listener

_open = Listener.open


def _open_then_stop(listener: Listener) -> None:
    _open(listener)
    os.kill(os.getpid(), signal.SIGSTOP)


if __name__ == "__main__":
    Listener.open = _open_then_stop  # type: ignore[method-assign,assignment]
    main()
