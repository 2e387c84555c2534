"""The lease deadline a cluster node publishes to its workers (docs/scaling.md section 2).

One small file per node home holds the node's lease id and a CLOCK_MONOTONIC time
(system-wide on Linux) until which that lease is proven. A worker in cluster mode reads
it before it writes and before it acknowledges, and refuses once the time has passed or
the lease is another one (its token was given under a lease that ended). The pair is
written twice in one 32-byte ``pwrite``; a reader that sees two different copies (a
write in progress) takes the lease as unproven: the check fails safe.
"""

from __future__ import annotations

import os
import struct
import time
from typing import Final

from worker.store.errors import NotOwnerNow, SessionIOError

_TWICE: Final = struct.Struct("<dqdq")


def write_deadline(fd: int, deadline: float, path: str, lease: int = 0) -> None:
    """Publish ``deadline`` (a ``time.monotonic()`` value; 0.0: nothing is proven) of ``lease``."""
    try:
        os.pwrite(fd, _TWICE.pack(deadline, lease, deadline, lease), 0)
    except OSError as exc:
        raise SessionIOError(path, exc.errno or 0, "write lease deadline") from exc


def read_lease(fd: int) -> tuple[float, int]:
    """Return the published (deadline, lease); (0.0, 0) if none or a write is in progress."""
    data = os.pread(fd, _TWICE.size, 0)
    if len(data) != _TWICE.size:
        return 0.0, 0
    deadline, lease, deadline_again, lease_again = _TWICE.unpack(data)
    if (deadline, lease) != (deadline_again, lease_again):
        return 0.0, 0
    return float(deadline), int(lease)


def read_deadline(fd: int) -> float:
    """Return the published deadline (0.0: none)."""
    return read_lease(fd)[0]


def lease_proven(fd: int, lease: int | None = None) -> bool:
    """True while the node's lease (``lease`` if given) is proven: a write may be acknowledged."""
    deadline, published = read_lease(fd)
    return time.monotonic() < deadline and (lease is None or lease == published)


class LeaseFence:
    """A cluster worker's check before it writes and before it acknowledges."""

    def __init__(self, path: str, lease: int, token: int = 0) -> None:
        self.path = path
        self.lease = lease
        self.token = token  # the session's fencing token, sent with every reply
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise SessionIOError(path, exc.errno or 0, "open lease deadline") from exc

    def check(self) -> None:
        """Raise NotOwnerNow unless the node's lease this worker was started under is proven."""
        if not lease_proven(self._fd, self.lease):
            raise NotOwnerNow(
                self.path, f"lease {self.lease:x} is not proven within its renew deadline"
            )

    def close(self) -> None:
        """Close the file."""
        os.close(self._fd)
