"""``<home>/logs/<id>.log``: a worker's output, a timestamp on every line, rotated by size.

The supervisor reads each worker's stdout and stderr (one pipe, so their order is kept)
from its loop and hands the bytes to a ``SessionLog``. Writes go to the page cache with
no fsync (these are diagnostics, not the session's state), so they return at memory
speed and never wait on the disk the way an fsync would. A line is written whole: a
partial line waits for its newline (up to ``MAX_PARTIAL`` bytes), so rotation never cuts
a line and two lines never share a timestamp.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Final

LOGS_DIR: Final = "logs"
LOG_SUFFIX: Final = ".log"
MAX_PARTIAL: Final = 64 * 1024
"""A line longer than this is written in pieces, each with its own timestamp."""
DEFAULT_MAX_BYTES: Final = 10 * 1024 * 1024
DEFAULT_BACKUPS: Final = 3


def log_path(home: str, session_id: str) -> str:
    return os.path.join(home, LOGS_DIR, session_id + LOG_SUFFIX)


def backup_path(path: str, n: int) -> str:
    return f"{path}.{n}"


def _stamp() -> bytes:
    now = time.time()
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
    return f"{seconds}.{int(now % 1 * 1000):03d}Z ".encode()


class SessionLog:
    """Appends timestamped lines to one session's log file, rotating at ``max_bytes``.

    The file is opened at the first line and closed by ``release`` or ``close``, so a
    session without a live worker (or a worker that is not writing) holds no descriptor.
    When a line would take the file past ``max_bytes``, ``<id>.log`` becomes
    ``<id>.log.1`` (``.1`` becomes ``.2``, and so on; the oldest beyond ``backups`` is
    deleted) and a new file is started.
    """

    def __init__(self, path: str, *, max_bytes: int, backups: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._fd: int | None = None
        self._size = 0
        self._partial = b""

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
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
            self._fd = os.open(self.path, flags, 0o600)
            self._size = os.fstat(self._fd).st_size
        return self._fd

    def _rotate(self) -> int:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self.backups <= 0:
            os.unlink(self.path)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(backup_path(self.path, self.backups))
            for n in range(self.backups - 1, 0, -1):
                with contextlib.suppress(FileNotFoundError):
                    os.rename(backup_path(self.path, n), backup_path(self.path, n + 1))
            os.rename(self.path, backup_path(self.path, 1))
        return self._open()
