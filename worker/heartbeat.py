"""A worker's heartbeat: a time in a page of memory shared with its supervisor.

The worker's loop writes ``time.monotonic()`` (CLOCK_MONOTONIC is the same clock in
every process) into the cell at each turn; the supervisor reads it when its hang check
comes due. A heartbeat is a store to memory, not a message: it wakes no one, so an idle
supervisor of any number of workers stays asleep.

The cell's second half says whether a batch of requests is in progress (from any
connection, direct ones included): the supervisor's idle check reads it, so a worker
in the middle of a request is never stopped as idle.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from typing import Final

_CELL: Final = struct.Struct("dd")
_TIME: Final = struct.Struct("d")
_BUSY_AT: Final = 8


class HeartbeatCell:
    """Eight bytes of shared memory holding the time of the last heartbeat."""

    def __init__(self, fd: int) -> None:
        """Map the memfd ``fd`` (the caller keeps or closes the descriptor itself)."""
        self._map = mmap.mmap(fd, _CELL.size)

    @classmethod
    def create(cls) -> tuple[HeartbeatCell, int]:
        """A new cell, stamped now, and the memfd to pass to the worker."""
        fd = os.memfd_create("loopd-heartbeat", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, _CELL.size)
            cell = cls(fd)
        except BaseException:
            os.close(fd)
            raise
        cell.beat()
        return cell, fd

    def beat(self) -> None:
        _TIME.pack_into(self._map, 0, time.monotonic())

    def last(self) -> float:
        """The monotonic time of the last heartbeat."""
        value: float = _TIME.unpack_from(self._map, 0)[0]
        return value

    def set_busy(self, busy: bool) -> None:
        """Mark a batch of requests as started (now) or finished."""
        _TIME.pack_into(self._map, _BUSY_AT, time.monotonic() if busy else 0.0)

    def busy_since(self) -> float | None:
        """When the batch in progress started; None if the worker is between batches."""
        value: float = _TIME.unpack_from(self._map, _BUSY_AT)[0]
        return value if value > 0.0 else None

    def close(self) -> None:
        self._map.close()
