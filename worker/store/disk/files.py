"""Reading a session's files as a hostile disk may present them.

Every file is opened relative to the session directory's fd, never through a symbolic
link and never blocking, and is read only once ``fstat`` says it is a regular file: a
FIFO would block a reader forever, a link to ``/dev/zero`` would be read without end,
and a link out of the home would be served as if it were the session's own.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Final, TypeAlias

from worker.store.backend import StoredFiles
from worker.store.errors import SessionIOError, SessionNotFound, UnsafeFile

_MISSING: Final = frozenset({errno.ENOENT})
_LINK: Final = frozenset({errno.ELOOP})
# O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever; the
# type is checked on the open fd before a byte is read. O_NOFOLLOW: never through a link.
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

Directory: TypeAlias = int | StoredFiles
"""Where a session's files are read: its directory's fd (the file store) or a backend's files."""


def _file_kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def open_directory(path: str) -> int:
    """Open the session directory ``path`` without following a link; return its fd."""
    try:
        return os.open(path, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in _LINK or (exc.errno == errno.ENOTDIR and os.path.islink(path)):
            # With O_DIRECTORY, Linux reports a final link as ENOTDIR rather than ELOOP.
            raise UnsafeFile(
                path, "is a symbolic link; loopd never follows a link to a session directory"
            ) from exc
        if exc.errno in _MISSING:
            raise SessionNotFound(path) from exc
        raise SessionIOError(path, exc.errno or 0, "open directory") from exc


def read_file(dir_fd: Directory, name: str, path: str) -> bytes:
    """Return the bytes of the regular file ``name`` in the directory ``dir_fd``.

    Opened relative to the session directory's fd, never through a link and never
    blocking; anything but a regular file (FIFO, device, directory, link) is refused as
    UnsafeFile before a byte is read. Other OS errors become SessionIOError (``path``).
    Another backend's files are read through it (``worker.store.backend``).
    """
    if not isinstance(dir_fd, int):
        return dir_fd.read(name, path)
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _LINK:
            raise UnsafeFile(
                path, "is a symbolic link; loopd never reads a session file through a link"
            ) from exc
        raise SessionIOError(path, exc.errno or 0, "open") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeFile(
                path, f"is {_file_kind(mode)}, not a regular file; refusing to read it"
            )
        chunks = []
        # One read of the whole file and one that sees its end (the file may grow
        # while a live writer appends; inspection reads it anyway).
        want = os.fstat(fd).st_size + 1
        while chunk := os.read(fd, want):
            chunks.append(chunk)
            want = 1 << 20
        return b"".join(chunks)
    except OSError as exc:
        raise SessionIOError(path, exc.errno or 0, "read") from exc
    finally:
        os.close(fd)


def list_names(dir_fd: Directory) -> list[str]:
    """The names in the session directory ``dir_fd`` (or another backend's session)."""
    return os.listdir(dir_fd) if isinstance(dir_fd, int) else dir_fd.names()
