"""The control socket: bound 0600, accepting on the loop, surviving descriptor exhaustion,
and answering ``busy`` to a connection past ``MAX_CLIENTS``."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import stat
from collections.abc import Callable
from typing import Final

from supervisor.control_socket import MAX_SOCKET_PATH, peer_uid, socket_path
from supervisor.daemon.connection import MAX_CLIENTS, client_budget
from supervisor.errors import ServeError
from worker.ipc.wire import encode, error

STAGING_SUFFIX: Final = ".new"
BACKLOG: Final = 128
ACCEPTS_PER_WAKE: Final = 64
RETRY_AFTER_EXHAUSTION: Final = 0.25
_OUT_OF_DESCRIPTORS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_PEER_GAVE_UP: Final = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EINTR})
_REFUSAL_UNSENT: Final = frozenset({errno.EAGAIN, errno.EPIPE, errno.ECONNRESET})
TOO_MANY: Final = encode(
    error(
        None,
        "busy",
        f"too many control connections (the limit is {MAX_CLIENTS}, each one a client "
        "that is still connected); retry once some have ended",
    )
)


class Listener:
    """Accepts control connections from our own uid and hands each to ``on_client``."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        home: str,
        on_client: Callable[[socket.socket], None],
        report: Callable[[str], None],
    ) -> None:
        self.loop = loop
        self.path = socket_path(home)
        self.on_client = on_client
        self.report = report
        self.exhausted = 0  # how many times accept ran out of descriptors
        self._sock: socket.socket | None = None
        self._paused = False
        self._short = False  # in an episode of descriptor exhaustion (reported once)
        self._crowded = False  # in an episode of refusing connections (reported once)
        self._retry: asyncio.TimerHandle | None = None

    def open(self) -> None:
        """Bind and listen; ServeError (one line, what to do) if the socket cannot be made."""
        # Bound under another name and renamed into place once listening: a client that
        # waits for the socket file never finds one that refuses it (ECONNREFUSED between
        # bind and listen).
        staging = self.path + STAGING_SUFFIX
        if len(os.fsencode(staging)) > MAX_SOCKET_PATH:
            raise ServeError(
                f"{self.path}: the socket path is {len(os.fsencode(self.path))} bytes, over the "
                f"{MAX_SOCKET_PATH - len(STAGING_SUFFIX)}-byte limit of a Unix socket (less "
                f"the {STAGING_SUFFIX!r} it is bound under first); choose a shorter --home"
            )
        self._remove_stale(self.path)
        self._remove_stale(staging)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # the socket is born 0600: no window where it is wider
        try:
            listener.bind(staging)
            os.chmod(staging, 0o600)
            listener.listen(BACKLOG)
            os.rename(staging, self.path)
        except OSError as exc:
            listener.close()
            raise ServeError(
                f"{self.path}: cannot create the control socket: {exc.strerror}; the home "
                "must be on a local file system that holds Unix sockets and be writable by you"
            ) from exc
        finally:
            os.umask(old_umask)
        listener.setblocking(False)
        self._sock = listener
        self.loop.add_reader(listener.fileno(), self._on_readable)

    @staticmethod
    def _remove_stale(path: str) -> None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ServeError(f"{path}: {exc.strerror}") from exc
        if not stat.S_ISSOCK(st.st_mode):
            raise ServeError(f"{path} exists and is not a socket: move it away, then serve again")
        os.unlink(path)  # stale: we hold the home lock, so no live daemon owns it

    def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
        if self._sock is not None:
            if not self._paused:
                self.loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
            if os.path.exists(self.path):
                os.unlink(self.path)

    def _on_readable(self) -> None:
        assert self._sock is not None
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                sock, _addr = self._sock.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in _PEER_GAVE_UP:
                    continue
                if exc.errno in _OUT_OF_DESCRIPTORS:
                    self._pause(exc)
                    return
                raise
            try:
                uid = peer_uid(sock)
            except OSError:
                sock.close()
                continue
            if uid != os.getuid():
                sock.close()  # peers of another uid are refused
                continue
            if self._short:
                self._short = False
                self.report("accepting again")
            sock.setblocking(False)
            if client_budget(self.loop).full():
                self._refuse(sock)
                continue
            if self._crowded:
                self._crowded = False
                self.report("serving new control connections again")
            self.on_client(sock)

    def _refuse(self, sock: socket.socket) -> None:
        """Answer ``busy`` (one frame, into an empty buffer: it fits) and close."""
        client_budget(self.loop).refused += 1
        if not self._crowded:
            self._crowded = True
            self.report(f"{MAX_CLIENTS} control connections are open: refusing new ones "
                        "with busy until some end")  # fmt: skip
        try:
            sock.send(TOO_MANY)
        except OSError as exc:
            if exc.errno not in _REFUSAL_UNSENT:
                sock.close()
                raise
        sock.close()

    def _pause(self, exc: OSError) -> None:
        """Out of descriptors: stop accepting for a moment (the backlog waits), say so."""
        self.exhausted += 1
        if not self._short:
            self._short = True
            self.report(
                f"accept failed: {exc.strerror}; pausing accepts for "
                f"{RETRY_AFTER_EXHAUSTION:g} s (raise the descriptor limit, `ulimit -n`)"
            )
        assert self._sock is not None
        self.loop.remove_reader(self._sock.fileno())
        self._paused = True
        self._retry = self.loop.call_later(RETRY_AFTER_EXHAUSTION, self._resume)

    def _resume(self) -> None:
        self._retry = None
        if self._sock is None:
            return
        self._paused = False
        self.loop.add_reader(self._sock.fileno(), self._on_readable)
        self._on_readable()
