"""The supervisor as subreaper: the children it waits for itself, and the strays it reaps.

Once the supervisor is a subreaper (prctl.become_subreaper), every process orphaned
below it becomes its child: its workers (as intended), and also what an App's worker
forked and left behind when the worker died. Those strays must be waited for, or each
stays a zombie of the supervisor. A child is a stray if no one here claimed it (workers
and templates are claimed from their fork until they are reaped) and it is in another
session than the supervisor's: a child the supervisor starts with ``subprocess.run``
shares its session and is waited for by its own code.
"""

from __future__ import annotations

import errno
import os
from typing import Final

_CLAIMED: Final[set[int]] = set()
_NO_CHILD: Final = frozenset({errno.ECHILD, errno.ESRCH})


def claim(pid: int) -> None:
    """``pid`` is waited for by its owner (a WorkerProcess, a template): never a stray."""
    _CLAIMED.add(pid)


def release(pid: int) -> None:
    """``pid`` was reaped by its owner."""
    _CLAIMED.discard(pid)


def reap_strays() -> int:
    """Reap every exited stray ahead of the first child someone else waits for; the count.

    waitid(WNOWAIT) shows one exited child without reaping it. A claimed one (its
    owner's pidfd callback reaps it soon) or one of the supervisor's own session ends
    the pass: the next SIGCHLD, or the owner's reap, runs it again.
    """
    reaped = 0
    own_session = os.getsid(0)
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped
        if info is None or info.si_pid in _CLAIMED:
            return reaped
        try:
            if os.getsid(info.si_pid) == own_session:
                return reaped
            os.waitpid(info.si_pid, 0)
        except OSError as exc:
            if exc.errno not in _NO_CHILD:
                raise
            return reaped  # reaped meanwhile by code that waits for it by pid
        reaped += 1
