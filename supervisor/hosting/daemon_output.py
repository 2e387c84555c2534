"""The daemon's own lines on stderr: written without ever blocking its loop, bounded, and
dropped with a count when nobody reads them.

``print(..., flush=True)`` to a pipe whose reader stopped (``loopd serve 2>&1 | less``,
a stalled log shipper) blocks once the pipe's 64 KiB are full, and with it every session.
Here a line is written with a non-blocking write; what the pipe does not take waits in a
queue of at most ``MAX_QUEUED`` bytes, flushed when the loop sees the descriptor
writable; past that, lines are dropped and counted, and the count is written as one line
once the reader takes lines again.

The non-blocking write must not change the shared file description (a terminal shared
with the shell, a pipe shared with the process's stdout), so O_NONBLOCK is set only on a
description of our own: a socket (journald's stream) is written with ``MSG_DONTWAIT``,
and a pipe or terminal is opened again through ``/proc/self/fd``. A regular file (a
redirect to a file) never waits for a reader and is written as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import stat
from collections import deque
from collections.abc import Callable
from typing import Final

MAX_QUEUED: Final = 256 << 10
"""Bytes of lines kept for a reader that is not reading, beyond what its pipe holds."""
_FULL: Final = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR})
_GONE: Final = frozenset({errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.EBADF, errno.EIO})
_REOPEN_REFUSED: Final = frozenset({errno.ENXIO, errno.ENOENT, errno.EACCES, errno.EPERM})
_UNWRITTEN: Final = "this output could not be written (a full disk?)"


class DaemonOutput:
    """Writes the daemon's lines to ``fd`` (stderr) for the operator; never blocks."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None, fd: int = 2) -> None:
        self.loop = loop
        self.dropped = 0  # lines dropped since the last count was written
        self.total_dropped = 0
        self.written = 0
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._watching = False
        self._fd = -1
        self._selectable = False
        self._write: Callable[[bytes], int] = self._discard
        self._sock: socket.socket | None = None
        self._cut = False  # the last line written to a file was cut short by an error
        self._open(fd)

    def _open(self, fd: int) -> None:
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            return  # no stderr at all: lines go nowhere
        if stat.S_ISSOCK(mode):
            with contextlib.suppress(OSError):
                self._sock = socket.socket(fileno=os.dup(fd))
                self._fd, self._selectable = self._sock.fileno(), True
                self._write = self._send
            return
        if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
            flags = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | os.O_APPEND
            try:
                self._fd = os.open(f"/proc/self/fd/{fd}", flags)
            except OSError as exc:
                if exc.errno not in _REOPEN_REFUSED:
                    raise
                # No reader on the pipe (ENXIO), or no /proc: a copy of the descriptor,
                # made non-blocking (its description is shared, the lesser evil).
                self._fd = os.dup(fd)
                os.set_blocking(self._fd, False)
            self._selectable = True
        else:
            self._fd = os.dup(fd)
            os.set_inheritable(self._fd, False)
        self._write = self._os_write

    def line(self, text: str) -> None:
        """Write one line (a newline is added), or queue it, or drop and count it."""
        data = (text.replace("\n", " ") + "\n").encode("utf-8", "replace")
        if not self._selectable and self._fd >= 0:
            self._append(data)
            return
        if self._queue:
            self._enqueue(data)
            return
        self._enqueue(self._write_some(data))
        if self._queue:
            self._watch()

    def _enqueue(self, data: bytes) -> None:
        if not data:
            return
        notice = self._notice() if self.dropped else b""
        if self._queued + len(notice) + len(data) > MAX_QUEUED:
            self.dropped += 1
            return
        if notice:
            # Where lines are missing, the count of the missing comes first.
            self.total_dropped += self.dropped
            self.dropped = 0
            self._queue.append(notice)
            self._queued += len(notice)
        self._queue.append(data)
        self._queued += len(data)

    def _notice(self, why: str = "this output was not read for a while") -> bytes:
        return f"loopd serve: {self.dropped} lines dropped: {why}\n".encode()

    def _write_some(self, data: bytes) -> bytes:
        """Write what the descriptor takes now; return the rest."""
        try:
            sent = self._write(data)
        except OSError as exc:
            if exc.errno in _FULL:
                return data
            if exc.errno in _GONE:
                self._close_descriptor()  # the reader is gone for good: nothing more to say
                return b""
            # Anything else (ENOSPC from /dev/full, EIO): this line is lost and counted,
            # never raised into the loop's callback that said it.
            self.dropped += 1
            return b""
        self.written += sent
        return data[sent:]

    def _append(self, data: bytes) -> None:
        """A regular file never waits for a reader, but its filesystem can be full: then the
        line is dropped and counted (never raised into the loop's callback that said it:
        a session's start once stopped half done there), and the count goes first once
        there is room again."""
        if self.dropped:
            # After a line cut short its newline first, so the count starts a line.
            data = (b"\n" if self._cut else b"") + self._notice(_UNWRITTEN) + data
        try:
            while data:
                sent = self._write(data)
                self.written += sent
                self._cut = 0 < sent < len(data)
                data = data[sent:]
        except OSError as exc:
            if exc.errno in _GONE:
                self._close_descriptor()
                return
            self.dropped += 1  # ENOSPC, EDQUOT, EFBIG, EIO: this line is lost, counted
            return
        self.total_dropped += self.dropped
        self.dropped = 0

    def _flush(self) -> None:
        """The descriptor is writable: write the queue, then the count of dropped lines."""
        while self._queue:
            head = self._queue.popleft()
            self._queued -= len(head)
            rest = self._write_some(head)
            if rest:
                self._queue.appendleft(rest)
                self._queued += len(rest)
                return
        if self.dropped:
            notice = self._notice()
            self.total_dropped += self.dropped
            self.dropped = 0
            self._enqueue(self._write_some(notice))
            if self._queue:
                return
        self._unwatch()

    def _watch(self) -> None:
        if self._watching or not self._selectable or self.loop is None or self.loop.is_closed():
            return
        self.loop.add_writer(self._fd, self._flush)
        self._watching = True

    def _unwatch(self) -> None:
        if self._watching and self.loop is not None and not self.loop.is_closed():
            self.loop.remove_writer(self._fd)
        self._watching = False

    def close(self) -> None:
        """One last try at what is queued (without waiting), then let the descriptor go."""
        if self._fd >= 0:
            self._flush()
        self._unwatch()
        self._close_descriptor()

    def _close_descriptor(self) -> None:
        self._unwatch()
        self._write = self._discard
        self._queue.clear()
        self._queued = 0
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        elif self._fd >= 0:
            os.close(self._fd)
        self._fd = -1

    def _send(self, data: bytes) -> int:
        assert self._sock is not None
        return self._sock.send(data, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)

    def _os_write(self, data: bytes) -> int:
        return os.write(self._fd, data)

    @staticmethod
    def _discard(data: bytes) -> int:
        return len(data)
