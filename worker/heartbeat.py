"""A worker's heartbeat: a page of memory shared with its supervisor.

The worker's loop writes ``time.monotonic()`` (CLOCK_MONOTONIC is the same clock in
every process) into the cell at each turn, before each request it hands to the App, and
whenever the App calls ``worker.turn.progress()``; the supervisor reads it when its hang
check comes due. A heartbeat is a store to memory, not a message: it wakes no one, so an
idle supervisor of any number of workers stays asleep.

The rest of the page names the requests being handled now (their keys' digests), so
that when a worker dies or is killed mid-turn its supervisor knows which requests were
running: a request that keeps killing its worker is refused as a poison request.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import time
from collections.abc import Iterable
from typing import Final

_HEAD: Final = struct.Struct("ddI")  # last beat, start of the running turn, digests held
PAGE: Final = 4096
DIGEST_SIZE: Final = 16
MAX_TURN_KEYS: Final = (PAGE - _HEAD.size) // DIGEST_SIZE
"""Requests a cell can name at once (a chunk of a batch never holds more)."""


def key_digest(key: str) -> bytes:
    """The 16-byte digest a request key is known by in the cell and in poison lists."""
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=DIGEST_SIZE).digest()


class HeartbeatCell:
    """One page of shared memory: the time of the last heartbeat and the running turn."""

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
        struct.pack_into("d", self._map, 0, time.monotonic())

    def last(self) -> float:
        """The monotonic time of the last heartbeat."""
        value: float = struct.unpack_from("d", self._map, 0)[0]
        return value

    def begin_turn(self, keys: Iterable[str]) -> None:
        """Name the requests handed to the App now (at most MAX_TURN_KEYS), and beat."""
        digests = [key_digest(key) for key in keys][:MAX_TURN_KEYS]
        now = time.monotonic()
        self._map[_HEAD.size : _HEAD.size + len(digests) * DIGEST_SIZE] = b"".join(digests)
        _HEAD.pack_into(self._map, 0, now, now, len(digests))

    def end_turn(self) -> None:
        """No request is being handled any more."""
        _HEAD.pack_into(self._map, 0, time.monotonic(), 0.0, 0)

    def turn(self) -> tuple[float | None, list[bytes]]:
        """When the running turn began (None: no turn) and its requests' key digests."""
        _beat, started, count = _HEAD.unpack_from(self._map, 0)
        count = min(count, MAX_TURN_KEYS)
        raw = bytes(self._map[_HEAD.size : _HEAD.size + count * DIGEST_SIZE])
        digests = [raw[i : i + DIGEST_SIZE] for i in range(0, len(raw), DIGEST_SIZE)]
        return (started if started else None), digests

    def close(self) -> None:
        self._map.close()
