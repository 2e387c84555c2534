"""``<home>/logs/<id>.log``: a worker's output, a timestamp on every line, rotated by size.

The supervisor reads each worker's stdout and stderr (one pipe, so their order is kept)
from its loop and hands the bytes to a ``SessionLog``. Writes go to the page cache with
no fsync (these are diagnostics, not the session's state), so they return at memory
speed and never wait on the disk the way an fsync would. A line is written whole: a
partial line waits for its newline (up to ``MAX_PARTIAL`` bytes), so rotation never cuts
a line and two lines never share a timestamp.

Rotation is O(1) whatever ``--log-backups`` is: the full file is renamed to the next
number (``<id>.log.N``, numbers only grow, the highest is the newest backup) and the one
``backups`` older is deleted; nothing is renamed down a chain. The existing numbers are
looked up once, at a log's first rotation. The file is opened with ``O_NOFOLLOW |
O_NONBLOCK`` and must be a regular file, so a FIFO or link put in its place is refused
(an OSError the caller reports) instead of blocking the daemon's loop.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Final

from supervisor.hosting.regular_file import APPEND_FLAGS, open_regular

LOGS_DIR: Final = "logs"
LOG_SUFFIX: Final = ".log"
MAX_PARTIAL: Final = 64 * 1024
"""A line longer than this is written in pieces, each with its own timestamp."""
DEFAULT_MAX_BYTES: Final = 10 * 1024 * 1024
DEFAULT_BACKUPS: Final = 3
MAX_BACKUPS: Final = 1000


def log_path(home: str, session_id: str) -> str:
    return os.path.join(home, LOGS_DIR, session_id + LOG_SUFFIX)


def backup_path(path: str, n: int) -> str:
    return f"{path}.{n}"


def backup_numbers(path: str) -> list[int]:
    """The numbers of the log's backups on disk (``<id>.log.N``), oldest (lowest) first."""
    directory, name = os.path.split(path)
    prefix = name + "."
    found = []
    try:
        with os.scandir(directory or ".") as entries:
            for entry in entries:
                suffix = entry.name[len(prefix) :]
                if entry.name.startswith(prefix) and suffix.isascii() and suffix.isdigit():
                    found.append(int(suffix))
    except FileNotFoundError:
        return []
    return sorted(found)


def _stamp() -> bytes:
    now = time.time()
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
    return f"{seconds}.{int(now % 1 * 1000):03d}Z ".encode()


class SessionLog:
    """Appends timestamped lines to one session's log file, rotating at ``max_bytes``.

    The file is opened at the first line and closed by ``release`` or ``close``, so a
    session without a live worker (or a worker that is not writing) holds no descriptor.
    When a line would take the file past ``max_bytes``, ``<id>.log`` becomes
    ``<id>.log.N`` (one more than the highest backup), the backup ``backups`` older than
    it is deleted, and a new file is started.
    """

    def __init__(self, path: str, *, max_bytes: int, backups: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._fd: int | None = None
        self._size = 0
        self._partial = b""
        self._next: int | None = None  # the next backup's number, once looked up

    def feed(self, data: bytes) -> None:
        """Take some of the worker's output; whole lines are written at once."""
        buffered = self._partial + data
        lines = buffered.split(b"\n")
        self._partial = lines.pop()
        while len(self._partial) > MAX_PARTIAL:
            lines.append(self._partial[:MAX_PARTIAL])
            self._partial = self._partial[MAX_PARTIAL:]
        if lines:
            self._write_lines(lines)

    def note(self, text: str) -> None:
        """A line of the supervisor's own about this session (start, exit, reason)."""
        self._write_lines([f"[loopd] {text}".encode()])

    def release(self) -> None:
        """Close the file until the next write (a pending partial line is kept)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        """Write a pending partial line and close the file."""
        if self._partial:
            partial, self._partial = self._partial, b""
            self._write_lines([partial])
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _write_lines(self, lines: list[bytes]) -> None:
        stamp = _stamp()
        for line in lines:
            entry = stamp + line + b"\n"
            fd = self._open()
            if self._size and self._size + len(entry) > self.max_bytes:
                fd = self._rotate()
            view = memoryview(entry)
            while view:
                view = view[os.write(fd, view) :]
            self._size += len(entry)

    def _open(self) -> int:
        if self._fd is None:
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            fd = open_regular(self.path, APPEND_FLAGS, 0o600)
            self._size = os.fstat(fd).st_size
            self._fd = fd
        return self._fd

    def _rotate(self) -> int:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self.backups <= 0:
            os.unlink(self.path)
            return self._open()
        if self._next is None:
            found = backup_numbers(self.path)
            self._next = (found[-1] if found else 0) + 1
            stale = [n for n in found if n <= self._next - self.backups]  # once, at start
        else:
            stale = [self._next - self.backups]
        for n in stale:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(backup_path(self.path, n))
        os.rename(self.path, backup_path(self.path, self._next))
        self._next += 1
        return self._open()
