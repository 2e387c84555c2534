"""A control client: one request to ``<home>/loopd.sock``, one reply."""

from __future__ import annotations

import os
import socket
import time
from typing import Final

from supervisor.daemon import SOCKET_NAME
from supervisor.errors import ControlError
from worker.wire import Channel, Message


def call(home: str, op: str, *, timeout: float = 60.0, **fields: object) -> object:
    """Send ``{"id", "op", **fields}`` and return the result; ControlError on an error reply."""
    path = os.path.join(home, SOCKET_NAME)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(path)
        except OSError as exc:
            raise ControlError(
                "no_daemon",
                f"cannot reach the supervisor at {path}: {exc.strerror} "
                f"(is `loopd serve --home {home}` running?)",
            ) from exc
        channel = Channel(sock)
        request: Message = {"id": 1, "op": op, **{k: v for k, v in fields.items() if v is not None}}
        try:
            channel.send(request)
            reply = channel.recv()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ControlError("closed", f"the supervisor closed the connection: {exc}") from exc
    finally:
        sock.close()
    if reply is None:
        raise ControlError("closed", "the supervisor closed the connection without a reply")
    if reply.get("ok") is True:
        return reply.get("result")
    failure = reply.get("error")
    if isinstance(failure, dict):
        raise ControlError(str(failure.get("code")), str(failure.get("message")))
    raise ControlError("bad_reply", f"unexpected reply {reply!r}")


RETRYABLE: Final = frozenset({"worker_died", "closed", "no_daemon"})
"""Error codes after which the same request (same key) may simply be sent again."""


def call_with_retry(home: str, op: str, *, deadline: float, **fields: object) -> object:
    """``call``, sent again unchanged after a retryable error until ``deadline`` (monotonic).

    With a request key, a request that was applied before its worker died is answered
    from the log the second time, so retrying never doubles its effect.
    """
    while True:
        try:
            return call(home, op, timeout=max(1.0, deadline - time.monotonic()), **fields)
        except ControlError as exc:
            if exc.code not in RETRYABLE or time.monotonic() > deadline:
                raise
