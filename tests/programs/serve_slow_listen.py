"""``loopd serve`` whose control socket listens ``DELAY`` seconds after it is bound.

Run as ``python -m tests.programs.serve_slow_listen serve ...``: a start slow between the bind
and the listen (a loaded machine) makes the window before the daemon answers wide
enough for a test to act in it every time.
"""

from __future__ import annotations

import socket
import time
from typing import Final

from supervisor.cli.group import main
from supervisor.control_socket import SOCKET_NAME
from supervisor.daemon.listener import STAGING_SUFFIX

DELAY: Final = 1.0
_listen = socket.socket.listen


def _listen_late(sock: socket.socket, backlog: int = 128) -> None:
    if sock.family == socket.AF_UNIX and str(sock.getsockname()).endswith(
        SOCKET_NAME + STAGING_SUFFIX
    ):
        time.sleep(DELAY)  # the slow start itself, not a wait for anything
    _listen(sock, backlog)


if __name__ == "__main__":
    socket.socket.listen = _listen_late  # type: ignore[method-assign,assignment]
    main()
