"""A direct connection to a session's worker, handed over by the daemon (SCM_RIGHTS).

The client asks the daemon ``{"op": "connect", "session"}``; the daemon makes a
socketpair, passes one end to the session's worker and the other back with its reply.
The socket returned is blocking, with kernel timeouts (SO_RCVTIMEO, SO_SNDTIMEO) of
``timeout`` seconds.
"""

from __future__ import annotations

import os
import socket
import time

from supervisor.client.control import TIMEVAL, exchange, open_control, result_of, timed_out
from supervisor.errors import ControlError
from worker.ipc.wire import Message, encode


def handed_link(home: str, session: str, tenant: str | None, timeout: float) -> socket.socket:
    """A new direct connection to ``session``'s worker (asked as ``tenant``; None: the
    operator); ControlError with the daemon's code if it gives none."""
    control = open_control(home, timeout)
    connect: Message = {"id": 1, "op": "connect", "session": session}
    if tenant is not None:
        connect["tenant"] = tenant
    request = encode(connect)
    try:
        try:
            replies, fds = exchange(control, request, 1, time.monotonic() + timeout)
        except TimeoutError as exc:
            raise timed_out(home, timeout) from exc
        except OSError as exc:
            raise ControlError("closed", f"the supervisor closed the connection: {exc}") from exc
    finally:
        control.close()
    try:
        result_of(replies[0])
    except ControlError:
        for fd in fds:
            os.close(fd)
        raise
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise ControlError("closed", "the supervisor sent no connection; retry")
    link = socket.socket(fileno=fds[0])
    seconds = int(timeout)
    bound = TIMEVAL.pack(seconds, int((timeout - seconds) * 1e6))
    link.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, bound)
    link.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, bound)
    return link
