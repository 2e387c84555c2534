"""A worker's heartbeat: a page of memory shared with its supervisor.

The worker's loop writes ``time.monotonic()`` (CLOCK_MONOTONIC is the same clock in
every process) into the cell at each turn, before each request it hands to the App, and
whenever the App calls ``worker.app.turn.progress()``; the supervisor reads it when its hang
check comes due. A heartbeat is a store to memory, not a message: it wakes no one, so an
idle supervisor of any number of workers stays asleep.

The cell also says whether a batch of requests is in progress (from any connection,
direct ones included): the supervisor's idle check reads it, so a worker in the middle
of a request is never stopped as idle. And it names the requests being handed to the
App now (their keys' digests), so that when a worker dies or is killed mid-turn its
supervisor knows which requests were running: a request that keeps killing its worker
is refused as a poison request.

Layout: the last beat, when the batch in progress began (negated once it ended: when
it ended; 0: none yet), when the running chunk began (0: none), how many digests
follow, then the digests. Each field is one aligned store, read without a lock: the
worst a torn read can do is take a session as busy or a chunk as running for one check
more.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import time
from collections.abc import Iterable
from typing import Final

_TIME: Final = struct.Struct("d")
_BEAT_AT: Final = 0
_BUSY_AT: Final = 8
_TURN_AT: Final = 16
_COUNT: Final = struct.Struct("I")
_COUNT_AT: Final = 24
_DIGESTS_AT: Final = 32
PAGE: Final = 4096
DIGEST_SIZE: Final = 16
MAX_TURN_KEYS: Final = (PAGE - _DIGESTS_AT) // DIGEST_SIZE
"""Requests a cell can name at once (a chunk of a batch never holds more)."""


def key_digest(key: str) -> bytes:
    """The 16-byte digest a request key is known by in the cell and in poison lists."""
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=DIGEST_SIZE).digest()


class HeartbeatCell:
    """One page of shared memory: the last heartbeat, the batch and the chunk running."""

    def __init__(self, fd: int) -> None:
        """Map the memfd ``fd`` (the caller keeps or closes the descriptor itself)."""
        self._map = mmap.mmap(fd, PAGE)

    @classmethod
    def create(cls) -> tuple[HeartbeatCell, int]:
        """A new cell, stamped now, and the memfd to pass to the worker."""
        fd = os.memfd_create("loopd-heartbeat", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, PAGE)
            cell = cls(fd)
        except BaseException:
            os.close(fd)
            raise
        cell.beat()
        return cell, fd

    def beat(self) -> None:
        _TIME.pack_into(self._map, _BEAT_AT, time.monotonic())

    def last(self) -> float:
        """The monotonic time of the last heartbeat."""
        value: float = _TIME.unpack_from(self._map, _BEAT_AT)[0]
        return value

    def set_busy(self, busy: bool) -> None:
        """Mark a batch of requests as started (now) or finished (now, stored negated:
        the supervisor's idle check takes a session whose batch ended within the idle
        period for not idle, though the worker's report of that batch is not in yet)."""
        now = time.monotonic()
        _TIME.pack_into(self._map, _BUSY_AT, now if busy else -now)

    def busy_since(self) -> float | None:
        """When the batch in progress started; None if the worker is between batches."""
        value: float = _TIME.unpack_from(self._map, _BUSY_AT)[0]
        return value if value > 0.0 else None

    def idle_since(self) -> float | None:
        """When the last batch ended; None while one runs or before the first."""
        value: float = _TIME.unpack_from(self._map, _BUSY_AT)[0]
        return -value if value < 0.0 else None

    def begin_turn(self, keys: Iterable[str]) -> None:
        """Name the requests handed to the App now (at most MAX_TURN_KEYS), and beat."""
        digests = [key_digest(key) for key in keys][:MAX_TURN_KEYS]
        now = time.monotonic()
        self._map[_DIGESTS_AT : _DIGESTS_AT + len(digests) * DIGEST_SIZE] = b"".join(digests)
        _COUNT.pack_into(self._map, _COUNT_AT, len(digests))
        _TIME.pack_into(self._map, _TURN_AT, now)
        _TIME.pack_into(self._map, _BEAT_AT, now)

    def end_turn(self) -> None:
        """No request is being handed to the App any more (the batch may go on)."""
        _COUNT.pack_into(self._map, _COUNT_AT, 0)
        _TIME.pack_into(self._map, _TURN_AT, 0.0)
        self.beat()

    def turn(self) -> tuple[float | None, list[bytes]]:
        """When the running chunk began (None: none) and its requests' key digests."""
        started: float = _TIME.unpack_from(self._map, _TURN_AT)[0]
        count = min(_COUNT.unpack_from(self._map, _COUNT_AT)[0], MAX_TURN_KEYS)
        raw = bytes(self._map[_DIGESTS_AT : _DIGESTS_AT + count * DIGEST_SIZE])
        digests = [raw[i : i + DIGEST_SIZE] for i in range(0, len(raw), DIGEST_SIZE)]
        return (started if started > 0.0 else None), digests

    def close(self) -> None:
        self._map.close()
