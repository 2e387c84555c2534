"""Apps for tests, loaded by real workers as ``tests.apps:NAME``."""

from __future__ import annotations

import errno
import os
import threading
import time

from worker.app import DefaultApp
from worker.ipc.wire import Message, field, optional_field
from worker.store.disk import durable
from worker.store.disk.durable import Boundary, Step
from worker.store.session import Session


class BlockingApp(DefaultApp):
    """The default app, except that the first text starting with ``block`` gets no reply.

    ``block-after`` applies the request (durably) first; ``block-before`` applies
    nothing. Either way the worker then writes ``<home>/blocked-<pid>`` and hangs, so a
    test can kill it with the request in flight. Once that marker exists (a retry after
    the restart), requests are handled normally.
    """

    def handle(self, session: Session, request: Message) -> Message:
        text = field(request, "text", str)
        key = optional_field(request, "key", str)
        home = os.path.dirname(os.path.dirname(session.dir))
        blocked_once = any(name.startswith("blocked-") for name in os.listdir(home))
        if blocked_once or not text.startswith("block") or (key and session.find_key(key)):
            return super().handle(session, request)
        if text.startswith("block-after"):
            super().handle(session, request)
        with open(os.path.join(home, f"blocked-{os.getpid()}"), "w") as marker:
            marker.write(text)
        threading.Event().wait()  # hang until killed: the request stays in flight
        raise AssertionError("unreachable")


def crashing_app(budget: int) -> DefaultApp:
    """An app factory that fails every time, after noting when it was called.

    The times (CLOCK_MONOTONIC is shared by all processes) let a test see the backoff.
    """
    with open(os.environ["LOOPD_TEST_CRASH_LOG"], "a") as log:
        log.write(f"{time.monotonic()}\n")
    raise RuntimeError("this app always crashes at start")


def _fail(step: Step, error: int, matches: str, *, skip: int = 0) -> None:
    """Make every ``step`` whose file name starts with ``matches`` fail with ``error``,
    after the first ``skip`` of them."""
    seen: list[Boundary] = []

    def hook(boundary: Boundary) -> None:
        if boundary.step is step and os.path.basename(boundary.path).startswith(matches):
            seen.append(boundary)
            if len(seen) > skip:
                raise OSError(error, os.strerror(error), boundary.path)

    durable.set_hook(hook)


def no_space_for_epoch_1_app(budget: int) -> DefaultApp:
    """The default app in a worker whose writes of epoch 1's files fail with ENOSPC."""
    _fail(Step.WRITE, errno.ENOSPC, "1.")
    return DefaultApp(budget)


def failing_log_fsync_app(budget: int) -> DefaultApp:
    """The default app in a worker whose fdatasyncs of epoch 0's log fail with EIO, once
    open has made what it read durable (the first one)."""
    _fail(Step.FSYNC, errno.EIO, "0.jsonl", skip=1)
    return DefaultApp(budget)


def eio_syncing_the_session_directory_app(budget: int) -> DefaultApp:
    """The default app in a worker whose fsyncs of the session directory ``s1`` fail with
    EIO: open cannot make what it read durable, and no restart will change that."""
    _fail(Step.FSYNC_DIR, errno.EIO, "s1")
    return DefaultApp(budget)


def enospc_on_epoch_end_app(budget: int) -> DefaultApp:
    """The default app in a worker whose first write of an EpochEnd fails with ENOSPC.

    The failure is injected at the store's real seam (the durable write boundary), for
    that one write only; the store cuts the file back and the session stays usable.
    """
    failed: list[Boundary] = []

    def hook(boundary: Boundary) -> None:
        if boundary.step is Step.WRITE and b'"EpochEnd"' in boundary.data and not failed:
            failed.append(boundary)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    durable.set_hook(hook)
    return DefaultApp(budget)


class SpinningApp(DefaultApp):
    """The default app, except that the first ``spin`` request loops forever (no syscall).

    It writes ``<home>/spinning-<pid>`` first; once that marker exists, ``spin`` is an
    ordinary request, so the retry after the restart is answered.
    """

    def handle(self, session: Session, request: Message) -> Message:
        home = os.path.dirname(os.path.dirname(session.dir))
        spun = any(name.startswith("spinning-") for name in os.listdir(home))
        if field(request, "text", str) == "spin" and not spun:
            with open(os.path.join(home, f"spinning-{os.getpid()}"), "w") as marker:
                marker.write("spin")
            while True:
                pass
        return super().handle(session, request)
