"""A session's lock held by a worker of a previous supervisor, on its way out.

A supervisor that dies (SIGKILL, the OOM killer) leaves its workers running: each sees
its channel end at its loop's next turn and exits, but one busy with a batch of
requests holds its session's lock until the batch is done. The next supervisor's
worker then finds the session locked. So does the next start after a template died
between forking a worker and answering (the worker lives on until it sees its channel
closed). When the holder is a loopd worker of the session other than its current one,
it is such a worker: the session waits for it to exit (its pidfd on the
loop), bounded by the hang timeout; a holder still there then is SIGKILLed, as its own
supervisor's hang check would have done, and the session starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Final

import psutil

_NAME_LIMIT: Final = 15  # the kernel keeps 15 bytes of a process's name (spawn's)
KILL_GRACE: Final = 5.0
"""Seconds a holder SIGKILLed past its bound has to disappear before the session is FATAL."""


def outgoing_worker(pid: int, session: str, current: int | None) -> psutil.Process | None:
    """The process ``pid`` if it is a loopd worker of ``session`` other than its current
    worker (``current``: that worker's pid, None when it has none).

    A child of this supervisor can be one: serve is the subreaper of its templates'
    workers, and a template that died between forking a worker and answering failed that
    start while the worker lived on, holding the lock until it sees its channel closed.
    """
    try:
        proc = psutil.Process(pid)
        if pid == current and proc.ppid() == os.getpid():
            return None  # the session's own worker: never "on its way out"
        name = proc.name()
        argv = proc.cmdline()
    except psutil.Error:
        return None
    if name == f"loopd:{session}"[:_NAME_LIMIT]:
        return proc  # forked by a supervisor (start method fork)
    if "-m" in argv and "worker" in argv and _argument(argv, "--session") == session:
        return proc  # started as python -m worker (start method exec)
    return None


def _argument(argv: list[str], flag: str) -> str | None:
    for index, arg in enumerate(argv[:-1]):
        if arg == flag:
            return argv[index + 1]
    return None


class HolderWait:
    """Waits for a lock holder (not our child) to exit: ``on_exit`` when it has; past
    ``bound`` it is SIGKILLed and waited for again; ``on_stuck(why)`` if even that fails."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        proc: psutil.Process,
        bound: float,
        on_exit: Callable[[], None],
        on_stuck: Callable[[str], None],
    ) -> None:
        self.loop = loop
        self.proc = proc
        self.bound = bound
        self._on_exit = on_exit
        self._on_stuck = on_stuck
        self._killed = False
        self._pidfd: int | None = None
        self._timer: asyncio.Handle | None = None
        try:
            self._pidfd = os.pidfd_open(proc.pid)
        except OSError:
            self._timer = loop.call_soon(self._exited)  # gone already
            return
        if not proc.is_running():  # the pid names another process now: ours is gone
            self._timer = loop.call_soon(self._exited)
            return
        loop.add_reader(self._pidfd, self._exited)
        self._timer = loop.call_later(bound, self._late)

    def _exited(self) -> None:
        self.cancel()
        self._on_exit()

    def _late(self) -> None:
        if self._killed:
            self.cancel()
            self._on_stuck(
                f"pid {self.proc.pid} holds the session's lock and did not exit within "
                f"{KILL_GRACE:g} s of SIGKILL"
            )
            return
        self._killed = True
        with contextlib.suppress(psutil.NoSuchProcess):  # psutil checks it is the same one
            self.proc.kill()
        self._timer = self.loop.call_later(KILL_GRACE, self._late)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pidfd is not None:
            self.loop.remove_reader(self._pidfd)
            with contextlib.suppress(OSError):
                os.close(self._pidfd)
            self._pidfd = None
