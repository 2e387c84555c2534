"""Restart every running session of a home, at most N at a time (``loopd restart --all``).

One connection carries the ``restart`` requests: at most ``at_once`` of them are
outstanding, and the daemon answers each only once its new worker has said ``ready``
(it serves again), so the next one is sent only then. A session that does not come
back (its restart answered with an error, or no answer within the timeout) stops the
roll: nothing more is sent, the restarts already asked for are waited for, and the
sessions never reached are listed.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from supervisor.client.control import (
    READ_SIZE,
    encode_request,
    open_control,
    result_of,
    statuses,
)
from supervisor.errors import ControlError
from worker.ipc.wire import FrameReader, Message, WireError

RESTARTED_STATES: Final = frozenset({"RUNNING", "STARTING", "BACKOFF"})
"""The sessions that are meant to be running. A STOPPED session stays stopped (the
operator's intent), a hibernated (IDLE) one starts with the new code at its next request
anyway, and a FATAL or EXITED one waits for ``loopd start``."""


@dataclass(slots=True)
class Done:
    """One session's restart: its status row after it, or why it did not come back."""

    session: str
    seconds: float
    row: Message | None = None
    failure: str | None = None


@dataclass(slots=True)
class Roll:
    """What ``restart_all`` did."""

    done: list[Done] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(session, state) of the sessions not restarted because they are not running."""
    not_reached: list[str] = field(default_factory=list)
    """Sessions never asked to restart because the roll stopped first."""

    @property
    def failed(self) -> list[Done]:
        return [d for d in self.done if d.failure is not None]


def restart_all(
    home: str,
    *,
    at_once: int | None,
    timeout: float,
    on_done: Callable[[Done], None] | None = None,
) -> Roll:
    """Restart every session in RESTARTED_STATES, in id order, ``at_once`` at a time
    (None: all together); ``timeout`` bounds the listing and each session's restart."""
    roll = Roll()
    queue: deque[str] = deque()
    for row in statuses(home, timeout=timeout):
        session, state = str(row.get("session")), str(row.get("state"))
        if state in RESTARTED_STATES:
            queue.append(session)
        else:
            roll.skipped.append((session, state))
    if queue:
        _roll(home, queue, at_once or len(queue), timeout, roll, on_done)
    roll.not_reached = list(queue)
    return roll


def _roll(
    home: str,
    queue: deque[str],
    window: int,
    timeout: float,
    roll: Roll,
    on_done: Callable[[Done], None] | None,
) -> None:
    pending: dict[int, tuple[str, float]] = {}  # request id -> (session, when it was sent)
    out = bytearray()
    reader = FrameReader()
    next_id = 1

    def finish(request_id: int, *, row: Message | None = None, failure: str | None = None) -> None:
        session, sent = pending.pop(request_id)
        done = Done(session, time.monotonic() - sent, row, failure)
        roll.done.append(done)
        if on_done is not None:
            on_done(done)

    sock = open_control(home, timeout)
    sock.setblocking(False)
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(sock, selectors.EVENT_READ)
            while True:
                while queue and not roll.failed and len(pending) < window:
                    out += encode_request({"id": next_id, "op": "restart", "session": queue[0]})
                    pending[next_id] = (queue.popleft(), time.monotonic())
                    next_id += 1
                if not pending:
                    return
                events = selectors.EVENT_READ | (selectors.EVENT_WRITE if out else 0)
                selector.modify(sock, events)
                now = time.monotonic()
                for request_id, (_session, sent) in list(pending.items()):
                    if now - sent >= timeout:
                        finish(request_id, failure=f"did not serve again within {timeout:g} s")
                if not pending:
                    continue
                first = min(sent for _session, sent in pending.values()) + timeout
                for _key, mask in selector.select(max(0.0, first - now)):
                    if mask & selectors.EVENT_WRITE and out:
                        with contextlib.suppress(BlockingIOError):  # woken early
                            del out[: sock.send(out)]
                    if mask & selectors.EVENT_READ:
                        for reply in _read(sock, reader):
                            answered = reply.get("id")
                            if not isinstance(answered, int) or answered not in pending:
                                continue  # the answer to a restart already given up on
                            try:
                                row = result_of(reply)
                            except ControlError as exc:
                                if exc.code == "not_found":  # deleted during the roll
                                    gone, _sent = pending.pop(answered)
                                    roll.skipped.append((gone, "deleted meanwhile"))
                                else:
                                    finish(answered, failure=f"{exc.message} [{exc.code}]")
                            else:
                                finish(answered, row=row if isinstance(row, dict) else None)
    except (ConnectionError, ControlError) as exc:
        why = exc.message if isinstance(exc, ControlError) else "the supervisor hung up"
        for request_id in list(pending):
            finish(request_id, failure=why)
    finally:
        sock.close()


def _read(sock: socket.socket, reader: FrameReader) -> list[Message]:
    """The replies whole in what the socket holds; ConnectionError at its end."""
    try:
        data = sock.recv(READ_SIZE)
    except BlockingIOError:
        return []
    if not data:
        raise ConnectionResetError("end of stream")
    try:
        return reader.feed(data)
    except WireError as exc:
        raise ControlError("bad_reply", str(exc)) from exc
