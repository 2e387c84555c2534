"""The two prctl(2) settings templates need, through the C library (ctypes, stdlib)."""

from __future__ import annotations

import ctypes
import os
import signal
from typing import Final

_PR_SET_PDEATHSIG: Final = 1
_PR_SET_CHILD_SUBREAPER: Final = 36


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}, {value}): {os.strerror(err)}")


def become_subreaper(*, on: bool = True) -> None:
    """Make this process the reaper of its orphaned descendants (Linux 3.4+).

    A worker forked by a template's short-lived intermediate is then reparented here,
    not to init: the supervisor waits for it and sees its real exit status. Not
    inherited by a fork, so a template is no subreaper.
    """
    _prctl(_PR_SET_CHILD_SUBREAPER, 1 if on else 0)


def die_with_parent(parent: int | None = None) -> None:
    """SIGKILL this process when the thread that forked it ends (the supervisor's).

    ``parent``: the pid the parent had before the fork, for a child that sets this first
    thing after it: a parent already gone by then (the child adopted) is checked for
    after the signal is armed, and the child ends at once, so no window is left in which
    it could outlive its parent.
    """
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent is not None and os.getppid() != parent:
        os._exit(1)  # nobody waits for this process any more


def live_on_parent_death() -> None:
    """Undo ``die_with_parent``: a worker outlives its supervisor to finish its batch."""
    _prctl(_PR_SET_PDEATHSIG, 0)
