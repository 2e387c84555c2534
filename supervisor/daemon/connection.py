"""One framed connection of the daemon's loop: msgpack messages, bounded both ways.

Each connection is an asyncio Protocol on a non-blocking transport. Output is bounded:
above the high-water mark (64 KiB for a client) the transport calls ``pause_writing`` and
a client's connection stops reading from its peer (a peer that does not read gets
nothing more to answer); past a hard limit the connection is aborted. What all the
control connections of a loop hold is bounded too (``ClientBudget``): at most
``MAX_CLIENTS`` of them, and past ``TOTAL_OUTPUT`` unread bytes among them all, the one
with the most unread is dropped first. A worker's channel is read
whatever is queued to it (``READS_WHEN_BACKED_UP``): its replies are what drains the
worker, so stopping them would deadlock both ends. Input is bounded by the frame
limit, and what a client sent is decoded ``FEED_SIZE`` bytes at a time as the messages
are taken (a pipeline of thousands of small requests is kept as bytes, not as thousands of
decoded messages); the messages whole before a bad frame are acted on first, then the
bad frame.
The transport owns the socket and closes it once; ``connection_lost`` is the one place
where a connection ends.

A pipelining peer is served in slices (issue 29): at most ``MESSAGES_PER_TURN`` messages
and about ``SLICE`` seconds of them, then the loop serves everyone else before its next
slice. A client that hung up gets nothing more done for it: what it had queued is
dropped, not computed for nobody.
"""

from __future__ import annotations

import asyncio
import errno
import select
import socket
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from worker.ipc.wire import FrameReader, Message, WireError, encode, error

HIGH_WATER: Final = 1 << 20
LOW_WATER: Final = 256 << 10
"""A worker's channel: flow control never stops reading it, these only say when it is full."""
CLIENT_HIGH_WATER: Final = 64 << 10
CLIENT_LOW_WATER: Final = 16 << 10
"""A control connection stops being read (and served) past 64 KiB of unread replies, and
is read again once its client has taken them down to 16 KiB."""
MAX_OUTPUT: Final = 32 << 20
"""Bytes buffered for a peer that does not read before its connection is dropped."""
MAX_CLIENTS: Final = 256
"""Control connections open at once; a further one is answered ``busy`` and closed."""
TOTAL_OUTPUT: Final = 64 << 20
"""Unread bytes of all control connections together; past it the one holding the most is
dropped (replies to requests already relayed to a worker arrive whatever the backlog)."""
FEED_SIZE: Final = 2 << 10
"""Bytes of what a client sent decoded at a time, once the messages decoded before are
taken (a worker's channel is decoded whole: its messages are its replies, taken at once)."""
MESSAGES_PER_TURN: Final = 64
"""Messages of one connection acted on per loop turn: a pipelining peer waits its turn."""
SLICE: Final = 0.002
"""Seconds of one connection's messages per loop turn: no message is started after its
slice ran out, so one costly request (a ``status`` of many sessions) is its whole slice."""
_HUNG_UP: Final = select.POLLHUP | select.POLLERR
"""A Unix socket reports POLLHUP once its peer closed (or shut down both ways): nobody is
left to read a reply. A half-closed peer (POLLRDHUP) is seen at its end of stream."""
_FULL: Final = frozenset({errno.EAGAIN, errno.ENOBUFS})
_GONE: Final = frozenset({errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN})
_OWN_PAUSES: Final = frozenset({"inbox", "broken"})
"""Reasons reading stops that still let the messages already read be acted on."""
_ANSWERED: Final = WireError("a bad frame, already answered")


@dataclass(slots=True, eq=False)
class ClientBudget:
    """What the control connections of one loop share: how many, and their unread bytes."""

    connections: set[FramedConnection] = field(default_factory=set)
    backed_up: set[FramedConnection] = field(default_factory=set)
    """Connections that had unread output when last written to (some may have drained)."""
    refused: int = 0
    dropped: int = 0

    def full(self) -> bool:
        """No further control connection may be served now."""
        return len(self.connections) >= MAX_CLIENTS

    def unread(self) -> int:
        """Bytes written to control connections and not yet taken by their peers."""
        total = 0
        for conn in list(self.backed_up):
            size = conn.backlog
            if not size:
                self.backed_up.discard(conn)
            total += size
        return total

    def shed(self) -> None:
        """Past ``TOTAL_OUTPUT``: drop the connections holding the most, until under it."""
        total = self.unread()
        while total > TOTAL_OUTPUT and self.backed_up:
            slowest = max(self.backed_up, key=lambda conn: conn.backlog)
            total -= slowest.backlog
            self.backed_up.discard(slowest)
            self.dropped += 1
            slowest.abort()

    def leave(self, conn: FramedConnection) -> None:
        self.connections.discard(conn)
        self.backed_up.discard(conn)


_BUDGETS: Final[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ClientBudget]] = (
    weakref.WeakKeyDictionary()
)


def client_budget(loop: asyncio.AbstractEventLoop) -> ClientBudget:
    """The budget shared by the control connections of ``loop``."""
    budget = _BUDGETS.get(loop)
    if budget is None:
        budget = _BUDGETS[loop] = ClientBudget()
    return budget


class FramedConnection(asyncio.Protocol):
    """A stream of messages in both directions; subclasses say what a message does."""

    READS_WHEN_BACKED_UP = False
    """Keep reading the peer while output to it is over the high-water mark."""
    ACTS_AFTER_PEER_LEFT = False
    """Act on the messages read from a peer that has since gone (a worker's last words);
    otherwise they are dropped with the connection (a client no longer there to answer)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock  # kept for passing descriptors (sendmsg); the transport owns it
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._reader = FrameReader()
        self._unfed = b""  # read, not decoded yet: decoded as the inbox empties
        self._fed_to = 0
        # Counted from its creation (the accept), so the listener's limit is exact.
        self._budget: ClientBudget | None = None
        if not self.READS_WHEN_BACKED_UP:
            self._budget = client_budget(asyncio.get_running_loop())
            self._budget.connections.add(self)
        self._paused_for: set[str] = set()
        self._inbox: deque[Message] = deque()
        self._scheduled = False
        self._broken: WireError | None = None  # a bad frame, answered after the inbox

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.READS_WHEN_BACKED_UP:
            transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)
        else:
            transport.set_write_buffer_limits(high=CLIENT_HIGH_WATER, low=CLIENT_LOW_WATER)
        if self._paused_for:
            transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        if self._broken is not None:
            return  # nothing after a bad frame can be read
        self._unfed = self._unfed[self._fed_to :] + data if self._unfed else data
        self._fed_to = 0
        self._work()

    def _decode(self) -> None:
        """Decode what was read (a client's ``FEED_SIZE`` bytes at a time) until a message
        is whole."""
        size = len(self._unfed) if self.READS_WHEN_BACKED_UP else FEED_SIZE
        while not self._inbox and self._fed_to < len(self._unfed) and self._broken is None:
            chunk = self._unfed[self._fed_to : self._fed_to + size]
            self._fed_to += len(chunk)
            try:
                self._inbox.extend(self._reader.feed(chunk))
            except WireError as exc:
                # What came whole before the bad frame is acted on first, then the bad frame.
                self._inbox.extend(exc.decoded)
                self._broken = exc
                self.pause_reading_for("broken")
                self._fed_to = len(self._unfed)  # nothing after it can be read
        if self._fed_to >= len(self._unfed):
            self._unfed = b""
            self._fed_to = 0

    def _drop_waiting(self) -> None:
        self._inbox.clear()
        self._unfed = b""
        self._fed_to = 0

    def _work(self) -> None:
        """Act on one slice of the waiting messages; read more only once all are taken."""
        self._scheduled = False
        self._decode()
        if self._inbox and self._peer_left():
            self._drop_waiting()  # nobody is there to read the replies: none is worked out
            self.abort()  # and its end, unseen while reading is paused, is now
            return
        ends = time.monotonic() + SLICE
        for _ in range(MESSAGES_PER_TURN):
            if self._ended_for_us():
                self._drop_waiting()  # a reply could not be written (its peer is gone) or
                return  # this end was dropped: what is left has nobody to be done for
            self._decode()
            if not self._inbox or self.closed or self._paused_for - _OWN_PAUSES:
                break
            self.on_message(self._inbox.popleft())
            if time.monotonic() >= ends:
                break
        self._decode()
        if self._inbox and not self.closed:
            self.pause_reading_for("inbox")
            if not self._paused_for - _OWN_PAUSES and not self._scheduled:
                self._scheduled = True
                asyncio.get_running_loop().call_soon(self._work)
            return
        self.resume_reading_for("inbox")
        broken = self._broken
        if broken is not None and broken is not _ANSWERED and not self.closed:
            self._broken = _ANSWERED  # answered once; still nothing more is read
            self.on_bad_frame(broken)

    def _ended_for_us(self) -> bool:
        """This end is closed or closing (a write failed, or it was dropped), and what is
        queued has nobody to be acted on for."""
        if self.ACTS_AFTER_PEER_LEFT:
            return False
        return self.closed or self.transport is None or self.transport.is_closing()

    def _peer_left(self) -> bool:
        """The peer hung up while its messages wait here (reading is paused meanwhile, so
        its end of stream is not seen): one non-blocking poll of the socket."""
        if self.ACTS_AFTER_PEER_LEFT or self._ended_for_us():
            return False  # a closed or closing end: the slice below drops what waits
        poller = select.poll()
        poller.register(self.sock.fileno(), 0)  # POLLHUP and POLLERR are always reported
        return any(events & _HUNG_UP for _fd, events in poller.poll(0))

    def eof_received(self) -> bool | None:
        return False  # close our side too: a half-closed peer gets no further replies

    def pause_writing(self) -> None:
        if not self.READS_WHEN_BACKED_UP:
            self.pause_reading_for("output")

    def resume_writing(self) -> None:
        self.resume_reading_for("output")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.leave_budget()
        self.on_closed()

    def leave_budget(self) -> None:
        """No longer counted among the loop's control connections (it ended, or never
        got onto the loop)."""
        if self._budget is not None:
            self._budget.leave(self)
            self._budget = None

    # -- for subclasses ---------------------------------------------------------------

    def on_message(self, message: Message) -> None:
        raise NotImplementedError

    def on_bad_frame(self, exc: WireError) -> None:
        """Answer a broken frame with an error, then close (what follows cannot be read)."""
        self.send(error(None, "bad_frame", str(exc)))
        self.close()

    def on_closed(self) -> None:
        """Called once, when the connection has ended."""

    # -- sending ------------------------------------------------------------------------

    @property
    def backlog(self) -> int:
        """Bytes written but not yet taken by the peer's socket."""
        if self.transport is None or self.closed or self.transport.is_closing():
            return 0
        return self.transport.get_write_buffer_size()

    def send(self, message: Message) -> bool:
        """Queue one message; False if the connection is gone or was dropped for backlog.

        Raises WireError if the message cannot be encoded (too large): nothing is sent.
        """
        return self.send_frame(encode(message))

    def send_frame(self, frame: bytes) -> bool:
        """Queue one encoded message; False if the connection is gone or was dropped."""
        if self.closed or self.transport is None or self.transport.is_closing():
            return False  # its end is on the way (connection_lost follows); nobody reads
        if self.backlog + len(frame) > MAX_OUTPUT:
            self.abort()  # it stopped reading long ago: drop it rather than grow without end
            return False
        self.transport.write(frame)
        if self._budget is not None and self.backlog:
            self._budget.backed_up.add(self)
            self._budget.shed()
            return not self.transport.is_closing()  # False if it was the one dropped
        return True

    def send_with_fd(self, message: Message, fd: int) -> bool:
        """Send one message carrying a descriptor (SCM_RIGHTS); False if it cannot go now.

        Only on an idle connection (nothing buffered), so the descriptor travels with the
        first byte of its own message and never overtakes earlier messages.
        """
        frame = encode(message)
        if self.closed or self.transport is None or self.transport.is_closing() or self.backlog:
            return False
        try:
            sent = socket.send_fds(self.sock, [frame], [fd])
        except OSError as exc:
            if exc.errno in _FULL or exc.errno in _GONE:
                return False  # full for now, or the peer died: its transport sees the end
            raise
        if sent < len(frame):
            self.transport.write(frame[sent:])
        return True

    def pause_reading_for(self, reason: str) -> None:
        if not self._paused_for and self.transport is not None and not self.closed:
            self.transport.pause_reading()
        self._paused_for.add(reason)

    def resume_reading_for(self, reason: str) -> None:
        if reason not in self._paused_for:
            return
        self._paused_for.discard(reason)
        if self.closed or self.transport is None:
            return
        if not self._paused_for:
            self.transport.resume_reading()
        elif (
            "inbox" in self._paused_for
            and not self._paused_for - _OWN_PAUSES
            and not self._scheduled
        ):
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._work)

    def close(self) -> None:
        """Close after what is queued has been written."""
        if self.transport is not None and not self.closed:
            self.transport.close()

    def abort(self) -> None:
        """Close now, dropping what is queued."""
        if self.transport is not None and not self.closed:
            self.transport.abort()


def connect(
    loop: asyncio.AbstractEventLoop,
    conn: FramedConnection,
    tasks: set[asyncio.Task[object]],
    on_error: Callable[[BaseException], None],
) -> None:
    """Put ``conn`` on the loop over its socket; the task is kept until it is done."""

    async def attach() -> object:
        return await loop.connect_accepted_socket(lambda: conn, conn.sock)

    task: asyncio.Task[object] = loop.create_task(attach())
    tasks.add(task)

    def done(finished: asyncio.Task[object]) -> None:
        tasks.discard(finished)
        if finished.cancelled():
            conn.leave_budget()
            conn.sock.close()  # the daemon is shutting down
        elif finished.exception() is not None:
            conn.leave_budget()
            conn.sock.close()
            on_error(finished.exception())  # type: ignore[arg-type]

    task.add_done_callback(done)
