"""Opening the daemon's own files so that a planted FIFO, device or link never blocks it.

``open(O_WRONLY)`` of a FIFO waits for a reader and ``open(O_RDONLY)`` for a writer: a
FIFO put in place of ``<home>/logs/<id>.log``, ``intent.json`` or ``loopd.toml`` would
stop the daemon (and its loop) in a system call no signal handler of asyncio can end.
Every file here is opened with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO opens at once, a link
is refused) and checked with ``fstat`` to be a regular file before a byte moves, as the
store does for its own files.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Final

_READ_FLAGS: Final = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
APPEND_FLAGS: Final = (
    os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
)
_KINDS: Final = (
    (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
)  # fmt: skip


def kind_of(mode: int) -> str:
    """What a file of ``mode`` is, in words ("a FIFO"), for an error message."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def _refuse(path: str, mode: int) -> OSError:
    return OSError(errno.EINVAL, f"not a regular file but {kind_of(mode)}", path)


def _explained(exc: OSError, path: str) -> OSError:
    """Why the open failed in words: ELOOP from O_NOFOLLOW is a symbolic link, ENXIO a
    FIFO without a reader, and so on (rather than "too many levels", "no such device")."""
    if exc.errno == errno.ELOOP:
        return OSError(errno.ELOOP, "a symbolic link (refused: the file itself must be here)", path)
    try:
        st = os.lstat(path)
    except OSError:
        return exc
    if not stat.S_ISREG(st.st_mode) and not stat.S_ISLNK(st.st_mode):
        return _refuse(path, st.st_mode)
    return exc


def open_regular(path: str, flags: int, mode: int = 0o600) -> int:
    """``os.open`` with ``O_NOFOLLOW | O_NONBLOCK`` added, then refused (OSError, EINVAL)
    unless it is a regular file; the descriptor is returned open."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        raise _explained(exc, path) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, st.st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str, limit: int) -> bytes | None:
    """The whole regular file at ``path``, or None if there is none; OSError if it is not a
    regular file, a link, unreadable, or longer than ``limit`` bytes (EFBIG)."""
    try:
        fd = open_regular(path, _READ_FLAGS)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise OSError(errno.EFBIG, f"{size} bytes, over the {limit}-byte limit", path)
        chunks: list[bytes] = []
        got = 0
        while got <= limit:
            chunk = os.read(fd, min(limit + 1 - got, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            raise OSError(errno.EFBIG, f"over the {limit}-byte limit", path)
        return b"".join(chunks)
    finally:
        os.close(fd)


def decode_utf8(data: bytes) -> str:
    """``data`` as UTF-8; ValueError naming the first bad byte and its offset otherwise
    (``json.loads`` of bytes would guess UTF-16 from NUL bytes and say that instead)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start} ({exc.reason})"
        ) from exc
