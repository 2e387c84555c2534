"""Every process the rig starts dies with the process that started it.

A CI job that times out SIGKILLs the rig's main process and nothing else: its pool
processes, their forked cases and those cases' workers would run on, orphaned, at full
CPU. Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``) ends a child when the
thread that forked it ends; each process of the rig sets it right after its fork, so a
kill anywhere up the tree reaches every process below it.
"""

from __future__ import annotations

import sys

from supervisor.templates import prctl


def die_with_parent(parent: int) -> None:
    """Be SIGKILLed when the process ``parent`` (which forked this one) ends: called
    first thing in a freshly forked child, with the pid the parent had before the fork
    (``supervisor.templates.prctl.die_with_parent``)."""
    if sys.platform != "linux":  # pragma: no cover - the rig's kills are Linux's
        return
    prctl.die_with_parent(parent)
