"""Every process the rig starts dies with the process that started it.

A CI job that times out SIGKILLs the rig's main process and nothing else: its pool
processes, their forked cases and those cases' workers would run on, orphaned, at full
CPU. Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``) ends a child when the
thread that forked it ends; each process of the rig sets it right after its fork, so a
kill anywhere up the tree reaches every process below it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Final

PR_SET_PDEATHSIG: Final = 1


def die_with_parent(parent: int) -> None:
    """Be SIGKILLed when the process ``parent`` (which forked this one) ends.

    Called first thing in a freshly forked child, with the pid the parent had before the
    fork: a parent already gone by then (the child now adopted) is checked for after the
    signal is armed, so no window is left in which the child could outlive it.
    """
    if sys.platform != "linux":  # pragma: no cover - the rig's kills are Linux's
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    if os.getppid() != parent:
        os._exit(1)  # the parent died before the signal was armed: nobody waits for us
