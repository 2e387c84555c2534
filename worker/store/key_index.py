"""The key index: every request key of the sealed epochs, found without reading their logs.

Open reads the newest epoch only, so the keys of older epochs would be out of sight;
this index keeps every one of them findable for the life of the session
(docs/format.md, "The key index"). It is derived from the logs, never the state:

- An entry is a key's 64-bit hash (BLAKE2b) and where the key was applied (its epoch
  and line). A hit is confirmed by reading that line of the sealed log, so a hash
  collision never answers a new request as a duplicate.
- The sealed epochs 0..n-1 are cut into aligned ranges of powers of two, largest first
  (n = 13: 0-7, 8-11, 12-12), one file ``<first>-<last>.keys`` per range that holds a
  key: the entries sorted, their hashes then their places, little-endian 8 bytes
  each. An epoch commit merges only the ranges that end below it into one, so a key
  is rewritten about log2(epochs) times over the session's life, and a look-up
  costs one binary search per range (at most log2(epochs) + 1).
- The epoch's ``SessionStart.key_index`` names each file with the SHA-256 of its
  bytes; open refuses a file that is missing or hashes otherwise, and ``verify``
  rebuilds the whole index from the logs and refuses any difference.
"""

from __future__ import annotations

import bisect
import errno
import hashlib
import os
import re
import sys
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

from worker.store.disk import durable
from worker.store.disk.files import Directory, read_file
from worker.store.errors import InvalidLog, KeyIndexFileError, SessionIOError, quote
from worker.store.format.dataclass_methods import MutableValue

INDEX_SUFFIX: Final = ".keys"
_LINE_BITS: Final = 32
_LINE_MASK: Final = (1 << _LINE_BITS) - 1
_HASH_MASK: Final = (1 << 64) - 1
_SEGMENT: Final = re.compile(r"(0|[1-9][0-9]*)-(0|[1-9][0-9]*):([0-9a-f]{64})")
_FILE_NAME: Final = re.compile(r"(0|[1-9][0-9]*)-(0|[1-9][0-9]*)\.keys")
_MISSING: Final = frozenset({errno.ENOENT})
# Why a stale index file may stay where it is: gone already, or this process may not
# remove it. Nothing reads a file the newest SessionStart does not name.
_LEFT_IN_PLACE: Final = frozenset({errno.ENOENT, errno.EACCES, errno.EPERM, errno.EROFS})

Confirm = Callable[[int, int], bool]
"""Whether the key looked up is the one applied at ``(epoch, line)`` (reads the log)."""


def key_hash(key: str) -> int:
    """The 64-bit hash a request key is indexed by: BLAKE2b-64 of its UTF-8, little-endian."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def epoch_ranges(epochs: int) -> list[tuple[int, int]]:
    """The ranges the sealed epochs ``0..epochs-1`` are cut into, oldest first.

    Aligned powers of two, one per bit of ``epochs``: 13 gives 0-7, 8-11, 12-12. The
    ranges of n + 1 epochs keep every range of n that ends below the last one's start.
    """
    ranges = []
    start = 0
    for bit in reversed(range(epochs.bit_length())):
        if epochs >> bit & 1:
            ranges.append((start, start + (1 << bit) - 1))
            start += 1 << bit
    return ranges


def _array(data: bytes) -> array[int]:
    values = array("Q")
    values.frombytes(data)
    if sys.byteorder == "big":
        values.byteswap()
    return values


def _bytes(values: array[int]) -> bytes:
    if sys.byteorder == "big":
        values = array("Q", values)
        values.byteswap()
    return values.tobytes()


@dataclass(frozen=True, slots=True, eq=False)
class Segment:
    """The entries of one range of sealed epochs, sorted by hash (then place)."""

    first: int
    last: int
    hashes: array[int]
    places: array[int]  # epoch << 32 | line, for the hash at the same index
    digest: str  # SHA-256 hex of ``data()``

    @property
    def name(self) -> str:
        """The file name: ``<first>-<last>.keys``."""
        return f"{self.first}-{self.last}{INDEX_SUFFIX}"

    def data(self) -> bytes:
        """The file's bytes: every hash, then every place, 8 bytes little-endian each."""
        return _bytes(self.hashes) + _bytes(self.places)

    def entries(self) -> list[int]:
        """The entries as ``hash << 64 | place``, in order."""
        return [h << 64 | p for h, p in zip(self.hashes, self.places, strict=True)]

    @classmethod
    def build(cls, first: int, last: int, entries: list[int]) -> Segment:
        """The segment of ``entries`` (``hash << 64 | place``, in any order)."""
        entries.sort()
        hashes = array("Q", [e >> 64 for e in entries])
        places = array("Q", [e & _HASH_MASK for e in entries])
        digest = hashlib.sha256(_bytes(hashes) + _bytes(places)).hexdigest()
        return cls(first, last, hashes, places, digest)

    @classmethod
    def from_bytes(cls, first: int, last: int, data: bytes, digest: str) -> Segment:
        """The segment a file holds (its digest already checked); half hashes, half places."""
        half = len(data) // 2
        return cls(first, last, _array(data[:half]), _array(data[half:]), digest)


def entry(key: str, epoch: int, line: int) -> int:
    """One entry of the index: ``hash << 64 | epoch << 32 | line``."""
    if not (0 <= epoch <= _LINE_MASK and 1 <= line <= _LINE_MASK):
        raise ValueError(f"epoch {epoch} or line {line} does not fit the key index")
    return key_hash(key) << 64 | epoch << _LINE_BITS | line


@dataclass(slots=True, repr=False, eq=False)
class KeyIndex(MutableValue):
    """The index of the sealed epochs ``0..covers-1``: one segment per range holding a key."""

    covers: int = 0
    segments: list[Segment] = field(default_factory=list)

    def field(self) -> str:
        """``SessionStart.key_index``: ``<first>-<last>:<sha256>`` per segment, ``,`` between."""
        return ",".join(f"{s.first}-{s.last}:{s.digest}" for s in self.segments)

    def __len__(self) -> int:
        return sum(len(s.hashes) for s in self.segments)

    def find(self, key: str, confirm: Confirm) -> tuple[int, int] | None:
        """Where ``key`` was applied in a sealed epoch, ``(epoch, line)``, or None.

        Each hash hit is confirmed against the log by ``confirm``; the newest ranges
        are searched first (a retry is most often of a recent request).
        """
        if not self.segments:
            return None
        wanted = key_hash(key)
        for segment in reversed(self.segments):
            hashes = segment.hashes
            at = bisect.bisect_left(hashes, wanted)
            while at < len(hashes) and hashes[at] == wanted:
                place = segment.places[at]
                epoch, line = place >> _LINE_BITS, place & _LINE_MASK
                if confirm(epoch, line):
                    return epoch, line
                at += 1
        return None

    def maybe_present(self, keys: list[str]) -> list[str]:
        """The ``keys`` whose hash is in some segment: every other one is in no sealed epoch.

        One pass per segment over the keys, none per key and segment in Python beyond a
        bisect: open checks the newest epoch's keys with it (``find`` then confirms the
        few it returns against the logs).
        """
        if not self.segments or not keys:
            return []
        wanted = [key_hash(key) for key in keys]
        hit = [False] * len(keys)
        for segment in self.segments:
            hashes, size = segment.hashes, len(segment.hashes)
            at = [bisect.bisect_left(hashes, value) for value in wanted]
            hit = [
                seen or (spot < size and hashes[spot] == value)
                for seen, spot, value in zip(hit, at, wanted, strict=True)
            ]
        return [key for key, seen in zip(keys, hit, strict=True) if seen]

    def extended(self, epochs: int, entries: Iterable[int]) -> tuple[KeyIndex, list[Segment]]:
        """The index of ``epochs`` sealed epochs, and its segments that are new.

        ``entries`` are those of the epochs from ``covers`` up; this index's segments
        are kept where their range stays and merged into the ranges that replace them.
        Deterministic: the same logs give the same bytes, whoever builds them.
        """
        if epochs < self.covers:
            raise ValueError(f"an index of {self.covers} epochs cannot shrink to {epochs}")
        pending: dict[tuple[int, int], list[int]] = {}
        ranges = epoch_ranges(epochs)
        starts = [first for first, _last in ranges]

        def range_of(epoch: int) -> tuple[int, int]:
            return ranges[bisect.bisect_right(starts, epoch) - 1]

        for value in entries:
            epoch = (value >> _LINE_BITS) & _LINE_MASK
            pending.setdefault(range_of(epoch), []).append(value)
        kept: dict[tuple[int, int], Segment] = {}
        for segment in self.segments:
            where = range_of(segment.first)
            if where == (segment.first, segment.last) and where not in pending:
                kept[where] = segment
            else:
                pending.setdefault(where, []).extend(segment.entries())
        new = {where: Segment.build(*where, values) for where, values in pending.items()}
        segments = [kept.get(where) or new[where] for where in ranges if where in kept | new]
        return KeyIndex(epochs, segments), [new[where] for where in ranges if where in new]


def parse_field(path: str, epochs: int, text: str) -> list[tuple[int, int, str]]:
    """Parse ``SessionStart.key_index`` of epoch ``epochs``: (first, last, digest) per file."""
    if not text:
        return []
    allowed = epoch_ranges(epochs)
    named = []
    for part in text.split(","):
        match = _SEGMENT.fullmatch(part)
        if match is None:
            raise InvalidLog(
                path, 1, f"SessionStart.key_index: {quote(part, 80)} is not <first>-<last>:<sha256>"
            )
        named.append((int(match[1]), int(match[2]), match[3]))
    ranges = [(first, last) for first, last, _digest in named]
    if any(r not in allowed for r in ranges) or ranges != sorted(set(ranges)):
        said = ", ".join(f"{a}-{b}" for a, b in ranges)
        cut = ", ".join(f"{a}-{b}" for a, b in allowed)
        raise InvalidLog(
            path,
            1,
            f"SessionStart.key_index names the ranges {quote(said, 80)}; the index of "
            f"epoch {epochs} is cut into {cut}",
        )
    return named


def load_index(dir_fd: Directory, directory: str, path: str, epochs: int, text: str) -> KeyIndex:
    """Read the index files a SessionStart (at ``path``) names; InvalidLog if one is not right."""
    segments = []
    for first, last, digest in parse_field(path, epochs, text):
        name = f"{first}-{last}{INDEX_SUFFIX}"
        file_path = os.path.join(directory, name)
        try:
            data = read_file(dir_fd, name, file_path)
        except SessionIOError as exc:
            if exc.errno in _MISSING:
                why = f"SessionStart.key_index names {name}, which is missing{_REBUILD}"
                raise KeyIndexFileError(path, 1, why) from exc
            raise
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest or len(data) % 16:
            raise KeyIndexFileError(
                path,
                1,
                f"SessionStart.key_index says {name} hashes to {digest}, it hashes to "
                f"{actual} ({len(data)} bytes){_REBUILD}",
            )
        segments.append(Segment.from_bytes(first, last, data, digest))
    return KeyIndex(epochs, segments)


_REBUILD: Final = "; the index is derived from the logs: `loopd repair ID` rebuilds it"


def write_segments(directory: str, segments: Iterable[Segment]) -> None:
    """Write each segment's file atomically; the caller's next directory fsync makes it durable."""
    for segment in segments:
        durable.write_file_atomic(
            os.path.join(directory, segment.name), segment.data(), sync_dir=False
        )


def stale_names(names: list[str], index: KeyIndex) -> list[str]:
    """The key index files among ``names`` that ``index`` does not name."""
    named = {segment.name for segment in index.segments}
    return [name for name in names if _FILE_NAME.fullmatch(name) and name not in named]


def remove_stale(dir_fd: int, directory: str, index: KeyIndex) -> None:
    """Remove the index files ``index`` does not name (replaced by a merge, or left by a crash)."""
    try:
        names = os.listdir(dir_fd)
    except OSError as exc:
        raise SessionIOError(directory, exc.errno or 0, "list directory") from exc
    for name in stale_names(names, index):
        try:
            os.unlink(name, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno not in _LEFT_IN_PLACE:
                path = os.path.join(directory, name)
                raise SessionIOError(path, exc.errno or 0, "unlink") from exc
