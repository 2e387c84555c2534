"""``workers-share-no-descriptor``, the supervised run's look at its workers' descriptors.

No two of serve's workers hold the same socket or pipe (past the standard streams) at
two looks in a row (every ``LOOK_INTERVAL`` during the load, and twice after it, before
serve is stopped). Each worker holds its own channel, heartbeat cell and client
connections, nothing of another session's and nothing of the template that forked it.
Only processes named as workers (``loopd:ID``) are looked at, and a fresh fork takes that
name only once it has closed what it inherited (supervisor/templates/worker_child.py);
two looks in a row are a margin on top.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Final

import psutil

from supervisor.proc_stat import start_ticks

WORKER_PREFIX: Final = "loopd:"  # a worker's process name (supervisor/templates/worker_child.py)
_SHARABLE: Final = ("socket:[", "pipe:[")  # what two processes may hold the same of
LOOK_INTERVAL: Final = 0.01
"""Seconds between two looks at the workers' descriptors (``workers-share-no-descriptor``)."""

Violate = Callable[[str, str], None]
"""Report a violation: its invariant's name, then what was seen."""


def look_for_shared(daemon_pid: int, done: threading.Event, violate: Violate) -> None:
    """Sample serve's workers' descriptors every ``LOOK_INTERVAL`` until ``done``, and
    twice more then (the last workers, idle, before serve is stopped)."""
    parent = psutil.Process(daemon_pid)
    shared = SharedDescriptors(violate)
    last = 2
    while last:
        if done.wait(LOOK_INTERVAL):
            last -= 1
        try:
            shared.sample(parent.children())
        except psutil.NoSuchProcess:
            return


class SharedDescriptors:
    """``workers-share-no-descriptor`` (module doc): a socket or pipe that the same two
    workers (pid and start time) hold at two ticks in a row is a violation, once."""

    def __init__(self, violate: Violate) -> None:
        self.violate = violate
        self.last: dict[str, frozenset[tuple[int, int, str]]] = {}
        self.seen: set[str] = set()

    def sample(self, children: list[psutil.Process]) -> None:
        holders: dict[str, set[tuple[int, int, str]]] = {}
        for child in children:
            try:
                name = child.name()
                if not name.startswith(WORKER_PREFIX):
                    continue
                holder = (child.pid, start_ticks(child.pid) or 0, name)  # not wall-clock time
            except psutil.Error:
                continue
            for held in _held(child.pid):
                holders.setdefault(held, set()).add(holder)
        now = {held: frozenset(who) for held, who in holders.items() if len(who) > 1}
        for held, both in now.items():
            again = both & self.last.get(held, frozenset())
            if len(again) > 1 and held not in self.seen:
                self.seen.add(held)
                names = ", ".join(f"{n} (pid {p})" for p, _t, n in sorted(again))
                self.violate("workers-share-no-descriptor", f"{names} hold the same {held}")
        self.last = now


def _held(pid: int) -> set[str]:
    """The sockets and pipes ``pid`` holds past its standard streams (none if it is gone)."""
    try:
        numbers = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    held = set()
    for number in numbers:
        if int(number) <= 2:
            continue
        try:
            target = os.readlink(f"/proc/{pid}/fd/{number}")
        except OSError:
            continue
        if target.startswith(_SHARABLE):
            held.add(target)
    return held
