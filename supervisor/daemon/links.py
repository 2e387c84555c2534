"""The daemon's two kinds of connection: a control client's, and a worker's channel."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from supervisor.daemon.connection import FramedConnection
from supervisor.daemon.operations import Daemon, dispatch
from supervisor.sessions.hosted import HostedSession
from supervisor.sessions.spawn import WorkerProcess
from worker.ipc.wire import Message, WireError, encode_reply, error

MAX_PENDING: Final = 256
"""Requests of one connection awaiting their reply before the daemon stops reading it."""
LINK_GRACE: Final = 1.0
"""Seconds to wait, after a worker's death, for the end of its channel (its last words)."""


class ClientConnection(FramedConnection):
    """One control connection (a peer of our own uid); every request gets one reply."""

    def __init__(self, sock: socket.socket, daemon: Daemon) -> None:
        super().__init__(sock)
        self.daemon = daemon
        self.pending = 0
        self.on_end: Callable[[ClientConnection], None] = lambda _connection: None
        self._bad_frame: WireError | None = None  # answered once the requests before it are

    def on_message(self, message: Message) -> None:
        self.pending += 1
        if self.pending >= MAX_PENDING:
            self.pause_reading_for("pending")  # answer what it asked before reading more
        dispatch(self.daemon, self, message)

    def _answered(self) -> None:
        if self.pending:
            self.pending -= 1
        if self.pending <= MAX_PENDING // 2:
            self.resume_reading_for("pending")

    def _after_reply(self) -> None:
        if self._bad_frame is not None and not self.pending:
            self.send(error(None, "bad_frame", str(self._bad_frame)))
            self._bad_frame = None
            self.close()

    def reply(self, message: Message) -> None:
        self._answered()
        try:
            self.send(message)
        except WireError as exc:
            self.send(error(message.get("id"), "too_large", str(exc)))
        self._after_reply()

    def reply_relayed(self, message: Message) -> None:
        """Reply for a request the worker applied: too large, it loses its big fields
        (named in ``omitted``), never its outcome (a keyless retry would apply it twice)."""
        self._answered()
        self.send_frame(encode_reply(message))
        self._after_reply()

    def on_bad_frame(self, exc: WireError) -> None:
        """Answer the bad frame once the requests before it are answered, then close."""
        self._bad_frame = exc
        self._after_reply()

    def reply_with_fd(self, message: Message, fd: int) -> bool:
        """Reply with a descriptor attached; False (nothing sent) if it cannot go now."""
        if not self.send_with_fd(message, fd):
            return False
        self._answered()
        self._after_reply()
        return True

    def deliver(self, message: Message) -> bool:
        """Stream one event; False (and the connection dropped) if it stopped reading."""
        return self.send({"event": message})

    def on_closed(self) -> None:
        self.on_end(self)


class WorkerLink(FramedConnection):
    """The daemon's end of a worker's control channel, read whatever is queued to it.

    What the daemon sends a worker is bounded where it is sent (``busy`` past
    MAX_WORKER_BACKLOG); what the worker sends back is what drains it, so its replies are
    read whatever the backlog (flow control on one direction never stops the other).
    """

    READS_WHEN_BACKED_UP = True
    ACTS_AFTER_PEER_LEFT = True  # a dead worker's last words are acted on

    def __init__(self, sock: socket.socket, hosted: HostedSession) -> None:
        super().__init__(sock)
        self.hosted = hosted
        self.on_end: Callable[[], None] = lambda: None

    def on_message(self, message: Message) -> None:
        self.hosted.on_worker_message(message)

    def on_bad_frame(self, exc: WireError) -> None:
        self.hosted.on_worker_broke_protocol(str(exc))
        self.abort()

    def on_closed(self) -> None:
        self.on_end()


@dataclass(slots=True)
class WorkerWatch:
    """A worker's two ends, its pidfd firing and its channel's end of stream: ``on_both``
    once both came, in either order (the channel given up ``LINK_GRACE`` after the death)."""

    hosted: HostedSession
    worker: WorkerProcess
    link: WorkerLink
    loop: asyncio.AbstractEventLoop
    on_both: Callable[[WorkerWatch], None]
    died: bool = False
    link_ended: bool = False
    grace: asyncio.TimerHandle | None = None

    def on_death(self) -> None:
        """The pidfd's reader: the worker died."""
        self.loop.remove_reader(self.worker.pidfd)
        self.died = True
        if self.link_ended:
            self._finish()
        else:
            # Its last words (an "exiting" reason, late replies) are still in the socket:
            # wait for their end of stream, but not forever (a grandchild may hold it).
            self.grace = self.loop.call_later(LINK_GRACE, self._give_up_on_link)

    def on_link_end(self) -> None:
        """The channel ended (its end of stream, or it could not be put on the loop)."""
        if self.link_ended:
            return
        self.link_ended = True
        if self.died:
            self._finish()

    def _give_up_on_link(self) -> None:
        if self.link.transport is None:
            self.link.sock.close()
            self.on_link_end()
        else:
            self.link.abort()  # connection_lost follows and ends the link

    def _finish(self) -> None:
        if self.grace is not None:
            self.grace.cancel()
        self.on_both(self)
