"""One connection of a worker: non-blocking, framed, with bounded output."""

from __future__ import annotations

import array
import os
import socket
from collections import deque
from typing import Final

from worker.ipc.wire import FrameReader, Message, encode_reply

READ_SIZE: Final = 1 << 18
MAX_OUTPUT: Final = 4 << 20
"""Bytes queued for a peer before the worker stops reading its requests."""
MAX_FDS: Final = 16


class Peer:
    """A stream the worker reads requests from and writes replies to."""

    def __init__(self, sock: socket.socket, *, takes_fds: bool = False) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.takes_fds = takes_fds
        self.reader = FrameReader()
        self.out = bytearray()
        self.fds: deque[int] = deque()
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self) -> list[Message] | None:
        """What the socket holds now, as messages; None at end of stream.

        Raises WireError on a bad frame.
        """
        try:
            data = self._recv_with_fds() if self.takes_fds else self.sock.recv(READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return []
        except ConnectionResetError:
            return None  # the peer died with data unread: as good as end of stream
        if not data:
            return None
        return self.reader.feed(data)

    def _recv_with_fds(self) -> bytes:
        fds = array.array("i")
        # MSG_CMSG_CLOEXEC: a descriptor received is close-on-exec from its arrival, as
        # every other of the worker's (an App's exec'd child keeps none of them).
        data, ancillary, _flags, _addr = self.sock.recvmsg(
            READ_SIZE, socket.CMSG_SPACE(MAX_FDS * fds.itemsize), socket.MSG_CMSG_CLOEXEC
        )
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
        self.fds.extend(fds)
        return data

    def take_fd(self) -> int | None:
        """The next descriptor received (they arrive with their messages, in order)."""
        return self.fds.popleft() if self.fds else None

    def queue(self, message: Message) -> None:
        """Queue one message; a reply too large for a frame is sent without its big fields.

        The request was applied by then, so it must be answered as applied, never as
        failed (a retry without a key would apply it twice).
        """
        self.out += encode_reply(message)

    def flush(self) -> None:
        """Write what the socket takes now."""
        while self.out and not self.closed:
            try:
                # MSG_NOSIGNAL: a client gone before its reply is an EPIPE, never a
                # SIGPIPE that would end the worker (and every other client's batch).
                sent = self.sock.send(self.out, socket.MSG_NOSIGNAL)
            except (BlockingIOError, InterruptedError):
                return
            except (BrokenPipeError, ConnectionResetError):
                self.out.clear()  # gone: its end of stream closes it
                return
            del self.out[:sent]

    @property
    def backed_up(self) -> bool:
        return len(self.out) > MAX_OUTPUT

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.sock.close()
            while self.fds:
                os.close(self.fds.popleft())
