"""Becoming a worker in a freshly forked child, from the supervisor or from a template.

The child never returns into the code that forked it: it runs the worker's main and
exits with its code (``os._exit``), whatever happens.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import resource
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Final, NoReturn

from supervisor.templates.order import CHANNEL_FD, HEARTBEAT_FD, ForkOrder
from worker.process import STORE_ENV

_ABOVE: Final = 10
"""Descriptors are moved above this before they are put at their numbers."""


def become_worker(
    order: ForkOrder, channel_fd: int, beat_fd: int, output_fd: int | None, *, on_path: bool
) -> NoReturn:
    """Set the child up as a worker (``on_path``: the App's import path is in place
    already, as in a template), run the worker and exit with its code."""

    def life() -> int:
        prepare_child()
        return run_worker(order, channel_fd, beat_fd, output_fd, on_path=on_path)

    child_main(life)


def child_main(life: Callable[[], int]) -> NoReturn:
    """Run ``life``, a forked child's whole life, and exit with its code, whatever
    happens: nothing unwinds into the parent's code."""
    code = 1
    try:
        code = life()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - nothing may unwind into the parent's code
        traceback.print_exc()
        code = 1
    finally:
        exit_child(code)


def place_descriptors(fds: list[int]) -> int | None:
    """Put an order's descriptors where its argv says (the channel, the heartbeat cell),
    moved above the low numbers first; the output pipe's descriptor, if it came."""
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, _ABOVE) for fd in fds]
    os.dup2(moved[0], CHANNEL_FD)
    os.dup2(moved[1], HEARTBEAT_FD)
    return moved[2] if len(moved) > 2 else None


def prepare_child() -> None:
    """What a freshly forked child does first, whatever session it will serve: its own
    session, the dispositions a fresh interpreter has, the parent's objects frozen."""
    os.setsid()  # its own session and process group, for killpg
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    # As a fresh interpreter has it (exec): a peer gone before its reply is EPIPE.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # Objects of the parent that own descriptors must never be finalized here: their
    # fd numbers are closed below and will be reused by the worker's files.
    gc.freeze()
    null = os.open(os.devnull, os.O_RDONLY)
    if null != 0:  # 0 already when the parent had no stdin
        os.dup2(null, 0)
        os.close(null)


def run_worker(
    order: ForkOrder, channel_fd: int, beat_fd: int, output_fd: int | None, *, on_path: bool
) -> int:
    """Become the worker of ``order`` in a prepared child (``prepare_child``); its code."""
    if output_fd is not None:
        os.dup2(output_fd, 1)  # dup2 clears close-on-exec on the copies
        os.dup2(output_fd, 2)
    close_all_but(channel_fd, beat_fd)
    # Named once it holds only its own descriptors: a process that goes by a worker's
    # name never holds what it inherited (the rig's workers-share-no-descriptor).
    name_process(f"loopd:{order.session}")
    os.environ.pop(STORE_ENV, None)  # the order's store or none, never one inherited
    os.environ.update(order.env)
    if order.cwd is not None:
        os.chdir(order.cwd)
    if not on_path:
        # A fork does not read PYTHONPATH again: the App's entries go first by hand.
        extra = [e for e in order.env.get("PYTHONPATH", "").split(os.pathsep) if e]
        sys.path[:0] = [*order.path, *extra]
    from worker.process import main  # noqa: PLC0415 - only the child runs the worker

    return main(list(order.argv))


def exit_child(code: int) -> NoReturn:
    """Flush what the child wrote and end it, never unwinding into the parent's code."""
    flush_std_streams()
    os._exit(code)


def flush_std_streams() -> None:
    """Before a fork: anything still buffered would otherwise be written twice."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # None: serve started with that descriptor closed
            with contextlib.suppress(OSError, ValueError):
                stream.flush()


def close_all_but(*keep: int) -> None:
    """Close every descriptor from 3 up, except ``keep``."""
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, _max_fd())


def name_process(name: str) -> None:
    """Set the name ps -o comm, top and pgrep show (the kernel keeps 15 bytes of it).

    One os.write: the io stack of ``open()`` cost a forked child about 0.4 ms here.
    """
    with contextlib.suppress(OSError):
        comm = os.open("/proc/self/comm", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(comm, name[:15].encode())
        finally:
            os.close(comm)


def _max_fd() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 65536
