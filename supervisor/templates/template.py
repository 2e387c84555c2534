"""The supervisor's handle on one template: fork it, hear its news, order workers, stop it."""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import select
import signal
import socket
import time
from typing import Final

from supervisor.templates import reaper
from supervisor.templates.order import (
    MAX_MESSAGE,
    AppIdentity,
    ForkOrder,
    OrderError,
    Said,
    SaidKind,
)
from supervisor.templates.template_main import run_template
from supervisor.templates.worker_child import flush_std_streams

REPLY_TIMEOUT: Final = 5.0
"""Seconds the supervisor waits for a template's answer to an order (a double fork,
about a millisecond) before it kills the template and fails that start."""
_GONE: Final = frozenset({errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ECONNREFUSED})


class TemplateState(enum.Enum):
    IMPORTING = "importing"
    READY = "ready"
    ENDED = "ended"
    """It failed to import, refused a thread, died or was stopped: never used again."""


_MOVES: Final = {
    TemplateState.IMPORTING: frozenset({TemplateState.READY, TemplateState.ENDED}),
    TemplateState.READY: frozenset({TemplateState.ENDED}),
    TemplateState.ENDED: frozenset({TemplateState.ENDED}),
}


class TemplateGone(OSError):
    """The template ended before it could take an order (fork the worker plainly)."""


class TemplateStale(TemplateGone):
    """The template refused an order: a file its App's import read changed since."""


class Template:
    """One running template: its pid, a pidfd readable at its death, its channel."""

    def __init__(self, identity: AppIdentity) -> None:
        """Fork the template from this (warm) supervisor; it imports the App on its own."""
        self.identity = identity
        self.state = TemplateState.IMPORTING
        self.news: Said | None = None
        self.started = time.monotonic()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        parent = os.getpid()
        flush_std_streams()
        try:
            pid = os.fork()
        except BaseException:
            ours.close()
            theirs.close()
            raise
        if pid == 0:
            run_template(theirs, identity, parent)
        reaper.claim(pid)
        theirs.close()
        self.pid = pid
        self.sock = ours
        self.sock.setblocking(False)
        self.pidfd = os.pidfd_open(pid)
        self.returncode: int | None = None

    def move(self, new: TemplateState) -> None:
        if new not in _MOVES[self.state]:
            raise ValueError(f"a template cannot go from {self.state.value} to {new.value}")
        self.state = new

    def ready(self) -> bool:
        """It takes orders (it imported the App and has not ended)."""
        return self.state is TemplateState.READY

    def hear_nowait(self) -> Said | None:
        """Read the template's readiness if it came (None: nothing yet, or its end)."""
        try:
            data = self.sock.recv(MAX_MESSAGE)
        except BlockingIOError:
            return None
        except OSError as exc:
            if exc.errno not in _GONE:
                raise
            data = b""
        if not data:
            self.move(TemplateState.ENDED)
            return None
        try:
            said = Said.decode(data)
        except OrderError:
            self.kill()  # not a template's message: never trusted with an order
            return None
        self.news = said
        self.move(TemplateState.READY if said.kind is SaidKind.READY else TemplateState.ENDED)
        return said

    def fork_worker(self, order: ForkOrder, fds: list[int]) -> int:
        """Have the template fork a worker; its pid (the supervisor's child, claimed).

        TemplateGone if the template could not take the order (no worker exists); any
        other OSError if it took it and failed, died or timed out (it is killed then).
        """
        try:
            socket.send_fds(self.sock, [order.encode()], fds)
        except OSError as exc:
            if exc.errno not in _GONE:
                raise
            self.move(TemplateState.ENDED)
            raise TemplateGone(
                exc.errno, f"the template of {self.identity.label()} is gone"
            ) from exc
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        # A blocking wait in the loop, as a plain fork is: bounded, and a millisecond or so.
        if not poller.poll(REPLY_TIMEOUT * 1000):
            self.kill()
            raise OSError(
                errno.ETIMEDOUT, f"the template of {self.identity.label()} did not answer"
            )
        try:
            data = self.sock.recv(MAX_MESSAGE)
        except OSError as exc:
            if exc.errno not in _GONE:
                raise
            data = b""
        if not data:
            self.move(TemplateState.ENDED)
            raise OSError(errno.EPIPE, f"the template of {self.identity.label()} died forking")
        try:
            said = Said.decode(data)
        except OrderError as exc:
            self.kill()
            raise OSError(errno.EPROTO, str(exc)) from exc
        if said.kind is SaidKind.STALE:
            self.move(TemplateState.ENDED)
            raise TemplateStale(errno.ESTALE, said.text)
        if said.kind is not SaidKind.FORKED or said.pid is None:
            raise OSError(errno.EAGAIN, f"the template could not fork: {said.text}")
        reaper.claim(said.pid)
        return said.pid

    def kill(self) -> None:
        """SIGKILL the template (its pidfd: never another process of the same pid) and its
        process group: what its App's import started, and an intermediate mid-fork (the
        workers have sessions of their own). The group is the template's pid, which no
        other group can take before the template is reaped."""
        self.move(TemplateState.ENDED)
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)

    def reap(self) -> int:
        """Wait for the template (call once it is dead, or after kill); its exit code."""
        _pid, status = os.waitpid(self.pid, 0)
        reaper.release(self.pid)
        self.returncode = os.waitstatus_to_exitcode(status)
        self.state = TemplateState.ENDED
        return self.returncode

    def close(self) -> None:
        """Release the channel and the pidfd (after reap)."""
        self.sock.close()
        os.close(self.pidfd)
