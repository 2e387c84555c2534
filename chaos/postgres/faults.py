"""The fault kinds at the PostgreSQL backend's boundaries, and the child's hook that meets them.

The child counts its fenced writes (worker.store.postgres.boundaries); at write k it
dies, sleeps, or stops and asks the rig to act on the database from outside (terminate
its connection, raise the session's owner token) before it goes on.
"""

from __future__ import annotations

import enum
import os
import signal
import time
from typing import Final

from chaos.faults.hook import EventPipe
from worker.store.postgres.boundaries import Point

SLOW_COMMIT_SECONDS: Final = 0.5
# What psycopg raises when the server's reply to COMMIT never arrives.
LOST_REPLY: Final = "consuming input failed: server closed the connection unexpectedly"


class SeamFault(enum.Enum):
    """One fault at a fenced write's COMMIT (docs/chaos.md, "The PostgreSQL seam")."""

    NONE = "none"
    KILL_BEFORE = "kill-before-commit"  # the worker SIGKILLed, its transaction open
    KILL_AFTER = "kill-after-commit"  # SIGKILLed after COMMIT returned, before it answered
    LOST_BEFORE = "lost-before-commit"  # the rig terminates the connection; COMMIT fails
    LOST_AFTER = "lost-after-commit"  # ... after COMMIT: the reply lost, the outcome unknown
    SLOW = "slow-commit"  # COMMIT waits SLOW_COMMIT_SECONDS first
    FENCE = "fence"  # another owner's claim arrives while the write holds the row

    @property
    def point(self) -> Point:
        """The boundary of the write at which the fault happens."""
        if self in (SeamFault.KILL_AFTER, SeamFault.LOST_AFTER):
            return Point.AFTER_COMMIT
        return Point.BEFORE_COMMIT

    @property
    def needs_rig(self) -> bool:
        """Whether the child stops at the boundary for the rig to act on the database."""
        return self in (SeamFault.LOST_BEFORE, SeamFault.LOST_AFTER, SeamFault.FENCE)


SEAM_FAULTS: Final = tuple(f for f in SeamFault if f is not SeamFault.NONE)


class SeamHook:
    """Counts fenced writes; injects ``fault`` at write ``at`` (0: never)."""

    def __init__(self, events: EventPipe, fault: SeamFault, at: int, go_fd: int) -> None:
        self.events = events
        self.fault = fault
        self.at = at
        self.go_fd = go_fd
        self.count = 0

    def __call__(self, point: Point, backend_pid: int) -> None:
        if point is Point.BEFORE_COMMIT:
            self.count += 1
        if self.count != self.at or point is not self.fault.point:
            return
        if self.fault in (SeamFault.KILL_BEFORE, SeamFault.KILL_AFTER):
            self.events.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault is SeamFault.SLOW:
            time.sleep(SLOW_COMMIT_SECONDS)
            return
        if self.fault.needs_rig:
            self.events.send({"e": "seam", "k": self.count, "pid": backend_pid}, flush=True)
            os.read(self.go_fd, 1)  # the rig acted on the database
        if self.fault is SeamFault.LOST_AFTER:
            import psycopg  # noqa: PLC0415 - only a child at this fault needs the driver

            raise psycopg.OperationalError(LOST_REPLY)
