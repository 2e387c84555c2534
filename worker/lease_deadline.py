"""The lease deadline a cluster node publishes to its workers (docs/scaling.md section 2).

One small file per node home holds a CLOCK_MONOTONIC time (system-wide on Linux) until
which the node's etcd lease is proven. A worker in cluster mode reads it before it
acknowledges a write and refuses to acknowledge once it has passed. The value is
written twice in one 16-byte ``pwrite``; a reader that sees two different values (a
write in progress) takes the deadline as passed: the check fails safe.
"""

from __future__ import annotations

import os
import struct
import time
from typing import Final

from worker.errors import NotOwnerNow, SessionIOError

_TWICE: Final = struct.Struct("<dd")


def write_deadline(fd: int, deadline: float, path: str) -> None:
    """Publish ``deadline`` (a ``time.monotonic()`` value; 0.0: nothing is proven)."""
    try:
        os.pwrite(fd, _TWICE.pack(deadline, deadline), 0)
    except OSError as exc:
        raise SessionIOError(path, exc.errno or 0, "write lease deadline") from exc


def read_deadline(fd: int) -> float:
    """Return the published deadline, or 0.0 if none is published or a write is in progress."""
    data = os.pread(fd, _TWICE.size, 0)
    if len(data) != _TWICE.size:
        return 0.0
    first, second = _TWICE.unpack(data)
    return float(first) if first == second else 0.0


def lease_proven(fd: int) -> bool:
    """True while the node's lease is proven: a write may be acknowledged now."""
    return time.monotonic() < read_deadline(fd)


class LeaseFence:
    """A cluster worker's check before it writes and before it acknowledges."""

    def __init__(self, path: str, token: int) -> None:
        self.path = path
        self.token = token
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise SessionIOError(path, exc.errno or 0, "open lease deadline") from exc

    def check(self) -> None:
        """Raise NotOwnerNow unless the node's lease is proven now."""
        if not lease_proven(self._fd):
            raise NotOwnerNow(self.path, "the node's lease is not proven within its renew deadline")

    def close(self) -> None:
        """Close the file."""
        os.close(self._fd)
