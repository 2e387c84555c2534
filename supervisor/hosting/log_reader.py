"""``loopd logs``: the last lines of a session's log, and following it across rotations.

The backups are ``<id>.log.N``, the highest number the newest (session_log.py). A
follower reads every file in order: when the file it reads is rotated away, it goes on
with the next backup on disk, oldest first, and only then with the current file, so a
follower that fell several rotations behind skips nothing that is still on disk. Every
file is opened as the daemon opens its own (``O_NOFOLLOW | O_NONBLOCK``, a regular file
only), so a FIFO planted as a log is refused instead of blocking the reader.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Final

from supervisor.hosting.regular_file import open_regular
from supervisor.hosting.session_log import backup_numbers, backup_path

FOLLOW_INTERVAL: Final = 0.2
"""Seconds between looks at a followed file (as ``tail -f`` does without inotify)."""
_CHUNK: Final = 64 * 1024
_READ: Final = os.O_RDONLY


def _open(path: str) -> int | None:
    """A read descriptor of the regular file ``path``; None if there is none."""
    try:
        return open_regular(path, _READ)
    except FileNotFoundError:
        return None


def last_lines(path: str, count: int) -> list[bytes]:
    """The last ``count`` lines of the log, reaching into its backups if it is short."""
    return b"".join(tail_chunks(path, count)).splitlines(keepends=True)


def tail_chunks(path: str, count: int) -> Iterator[bytes]:
    """The bytes of the last ``count`` lines of the log and its backups, oldest first.

    Files are scanned from their end for newlines (memory and time follow what is shown,
    not the files' size), newest first, until ``count`` lines are found; then they are
    streamed in order. A backup deleted in between is skipped.
    """
    if count <= 0:
        return
    current = _open(path)
    try:
        chosen: list[tuple[str | None, int]] = []  # (backup name, or None for current; start)
        left = count
        if current is not None:
            start, found = _start_of_last(current, left)
            chosen.append((None, start))
            left -= found
        for n in reversed(backup_numbers(path)):
            if left <= 0:
                break
            name = backup_path(path, n)
            fd = _open(name)
            if fd is None:
                continue
            try:
                start, found = _start_of_last(fd, left)
            finally:
                os.close(fd)
            chosen.append((name, start))
            left -= found
        for chosen_name, start in reversed(chosen):
            if chosen_name is None:
                assert current is not None
                yield from _chunks(current, start)
                continue
            fd = _open(chosen_name)
            if fd is not None:
                try:
                    yield from _chunks(fd, start)
                finally:
                    os.close(fd)
    finally:
        if current is not None:
            os.close(current)


def _start_of_last(fd: int, wanted: int) -> tuple[int, int]:
    """Where the file's last ``wanted`` lines begin, and how many lines that is (fewer if
    the file holds fewer); a last line without its newline counts as a line."""
    size = os.fstat(fd).st_size
    if size == 0:
        return 0, 0
    ends_with_newline = os.pread(fd, 1, size - 1) == b"\n"
    # The wanted lines start after the k-th newline from the end.
    k = wanted + (1 if ends_with_newline else 0)
    seen = 0
    end = size
    while end > 0:
        start = max(0, end - _CHUNK)
        chunk = os.pread(fd, end - start, start)
        here = chunk.count(b"\n")
        if seen + here >= k:
            at = len(chunk)
            for _ in range(k - seen):
                at = chunk.rindex(b"\n", 0, at)
            return start + at + 1, wanted
        seen += here
        end = start
    return 0, seen + (0 if ends_with_newline else 1)


def _chunks(fd: int, start: int) -> Iterator[bytes]:
    offset = start
    while chunk := os.pread(fd, _CHUNK, offset):
        offset += len(chunk)
        yield chunk


def follow(
    path: str, *, from_end: bool = True, keep_going: Callable[[], bool] = lambda: True
) -> Iterator[bytes]:
    """Yield what is appended to ``path``, and every file it is rotated into, in order.

    The file is opened (and its end found) on the call, not at the first ``next``, so
    nothing written in between is missed.
    """
    follower = _Follower(path)
    follower.start(from_end=from_end)
    return follower.run(keep_going)


class _Follower:
    """Reads one log and its rotations in the order they were written."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None
        self.number: int | None = None  # the backup being read; None: the current file
        self.floor = 0  # every backup up to this number is older than what we read

    def start(self, *, from_end: bool) -> None:
        numbers = backup_numbers(self.path)
        self.floor = numbers[-1] if numbers else 0
        self.fd = _open(self.path)
        if self.fd is not None and from_end:
            os.lseek(self.fd, 0, os.SEEK_END)

    def run(self, keep_going: Callable[[], bool]) -> Iterator[bytes]:
        try:
            while keep_going():
                if self.fd is None:
                    self._open_next()
                    if self.fd is None:
                        time.sleep(FOLLOW_INTERVAL)
                    continue
                data = os.read(self.fd, _CHUNK)
                if data:
                    yield data
                    continue
                if self.number is not None:
                    self._open_next()  # a backup read to its end: on to the next file
                elif self._replaced():
                    # Rotated: what the writer added before the rename is read next (the
                    # loop drains it), then the files after it, in order.
                    held = self._rotated_number()
                    # Deleted already (rotated past --log-backups): every backup left
                    # above the floor is newer than it.
                    self.number = held if held is not None else self.floor
                else:
                    time.sleep(FOLLOW_INTERVAL)
        finally:
            if self.fd is not None:
                os.close(self.fd)

    def _replaced(self) -> bool:
        assert self.fd is not None
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return self._rotated_number() is not None  # renamed, its successor not yet made
        mine = os.fstat(self.fd)
        return (now.st_ino, now.st_dev) != (mine.st_ino, mine.st_dev)

    def _rotated_number(self) -> int | None:
        """The backup number the file we hold was renamed to, if it is still on disk."""
        assert self.fd is not None
        mine = os.fstat(self.fd)
        for n in reversed(backup_numbers(self.path)):
            if n <= self.floor:
                break
            try:
                st = os.stat(backup_path(self.path, n))
            except FileNotFoundError:
                continue
            if (st.st_ino, st.st_dev) == (mine.st_ino, mine.st_dev):
                return n
        return None

    def _open_next(self) -> None:
        """Open the oldest backup newer than what was read, else the current file."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        done = self.floor if self.number is None else max(self.floor, self.number)
        self.floor, self.number = done, None
        while True:
            for n in backup_numbers(self.path):
                if n > done:
                    fd = _open(backup_path(self.path, n))
                    if fd is not None:
                        self.fd, self.number = fd, n
                        return
            fd = _open(self.path)
            if fd is None:
                return
            if not any(n > done for n in backup_numbers(self.path)):
                self.fd = fd
                return
            # Rotated between the listing and the open: those backups are older than the
            # file just opened, so they are read first (it is opened again after them).
            os.close(fd)
