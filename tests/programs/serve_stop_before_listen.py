"""``loopd serve`` that stops itself (SIGSTOP) just before its control socket listens.

Run as ``python -m tests.programs.serve_stop_before_listen serve ...``. A test can then look at
the home while the daemon is frozen between ``bind()`` and ``listen()``, and resume it
with SIGCONT.
"""

from __future__ import annotations

import os
import signal
import socket

from supervisor.cli.group import main

_listen = socket.socket.listen


def _stop_then_listen(sock: socket.socket, backlog: int = 128) -> None:
    if sock.family == socket.AF_UNIX:
        os.kill(os.getpid(), signal.SIGSTOP)
    _listen(sock, backlog)


if __name__ == "__main__":
    socket.socket.listen = _stop_then_listen  # type: ignore[method-assign,assignment]
    main()
