"""The session lock: ``flock`` on the session directory's own fd, held until close."""

from __future__ import annotations

import errno
import fcntl
import os
from typing import Final

from worker.store.disk.fork_guard import guard_fd, release_fd
from worker.store.errors import SessionIOError, SessionLocked, UnsafeFile

_WOULD_BLOCK: Final = frozenset({errno.EWOULDBLOCK, errno.EAGAIN})
_LINK: Final = frozenset({errno.ELOOP})
_PROC_LOCKS: Final = "/proc/locks"


def lock_directory(path: str, *, shared: bool = False) -> int:
    """Open ``path`` and take a non-blocking flock on it; return the fd that holds it.

    Raises SessionLocked (with the holder's pid when /proc/locks tells it) if another
    open file description holds a conflicting lock.
    """
    try:
        # O_NOFOLLOW: a session directory that is a link (to another session, or out of
        # the home) is never served; the lock fd is also the fd every file is read through.
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in _LINK or (exc.errno == errno.ENOTDIR and os.path.islink(path)):
            # With O_DIRECTORY, Linux reports a final link as ENOTDIR rather than ELOOP.
            raise UnsafeFile(path, "is a symbolic link; loopd never follows a link") from exc
        raise SessionIOError(path, exc.errno or 0, "open directory") from exc
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except OSError as exc:
        holder = lock_holder_pid(fd)
        os.close(fd)
        if exc.errno in _WOULD_BLOCK:
            raise SessionLocked(path, holder) from exc
        raise SessionIOError(path, exc.errno or 0, "flock") from exc
    # The App's forked children must not hold it past the worker (issue 29): covered in
    # every child of os.fork (O_CLOEXEC covers exec).
    guard_fd(fd)
    return fd


def unlock_directory(fd: int) -> None:
    """Release the lock by closing its fd (the kernel drops a flock with its last fd)."""
    release_fd(fd)
    os.close(fd)


def lock_holder_pid(fd: int) -> int | None:
    """Return the pid /proc/locks gives for an exclusive flock on ``fd``'s inode, if any.

    flock has no F_GETLK; /proc/locks names the process that took the lock, which is
    the holder unless it passed the fd on through fork. None when it cannot be known.
    """
    st = os.fstat(fd)
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open(_PROC_LOCKS, encoding="ascii") as table:
            for row in table:
                # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"; blocked waiters
                # carry a "->" column and are not holders.
                parts = row.split()
                if (
                    len(parts) >= 6
                    and parts[1:4] == ["FLOCK", "ADVISORY", "WRITE"]
                    and parts[5] == wanted
                    and parts[4].isdigit()
                ):
                    return int(parts[4])
    except OSError:
        return None
    return None
