"""The highest fencing token a step carried to a follower's copy: ``<root>/fences/<id>``.

Kept beside the copies, not in them, for a token above the one the copy's log records
(``worker/store/replica.py``). The file is read as the store reads a session's files:
never through a link, never blocking (a FIFO there is refused, not waited on), and only
a regular file of digits is a token; anything else is refused in one line.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Final

from worker.store import durable
from worker.store.errors import SessionIOError, UnsafeFile
from worker.store.replica_types import ReplicaRefused

FENCES_DIR: Final = "fences"
_EXISTS: Final = frozenset({errno.EEXIST})
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def fence_path(root: str, session_id: str) -> str:
    """``<root>/fences/<id>``: the highest token a step carried to the copy, if above its log's."""
    return os.path.join(root, FENCES_DIR, session_id)


def read_fence(root: str, session_id: str) -> int:
    """The token recorded for the copy (0 if none); UnsafeFile or ReplicaRefused if the
    file is not a regular file holding a token, SessionIOError if it cannot be read."""
    path = fence_path(root, session_id)
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFile(path, "is a symbolic link; loopd never follows a link") from exc
        raise SessionIOError(path, exc.errno or 0, "read") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeFile(path, "is not a regular file; refusing to read it as a token")
        text = os.read(fd, 64)
    except OSError as exc:
        raise SessionIOError(path, exc.errno or 0, "read") from exc
    finally:
        os.close(fd)
    if not text.rstrip(b"\n").isdigit():
        raise ReplicaRefused(path, f"not a token: {text[:40]!r}")
    return int(text)


def raise_fence(root: str, session_id: str, token: int) -> None:
    """Record ``token`` as the highest seen, durably, before anything it carries is written."""
    if token <= read_fence(root, session_id):
        return
    fences = os.path.join(root, FENCES_DIR)
    if not os.path.isdir(fences):
        try:
            durable.mkdir(fences)
        except SessionIOError as exc:
            if exc.errno not in _EXISTS:
                raise
        durable.fsync_dir(root)
    durable.write_file_atomic(fence_path(root, session_id), f"{token}\n".encode())
