"""A socket that a signal writes a byte to, so a handler that only sets a flag still
ends the worker's wait in select."""

from __future__ import annotations

import contextlib
import signal
import socket


class SignalWake:
    """``signal.set_wakeup_fd`` on a socketpair; its read end goes in the selector.

    Only in the main thread (signals are handled nowhere else); elsewhere the socket
    simply never becomes readable.
    """

    def __init__(self) -> None:
        self.sock, self._write = socket.socketpair()
        self.sock.setblocking(False)
        self._write.setblocking(False)
        self._previous: int | None = None
        with contextlib.suppress(ValueError):  # not the main thread
            self._previous = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)

    def drain(self) -> None:
        """Read the bytes the signals wrote (their numbers: the handlers say what to do)."""
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while self.sock.recv(4096):
                pass

    def close(self) -> None:
        if self._previous is not None:
            signal.set_wakeup_fd(self._previous)
        self.sock.close()
        self._write.close()
