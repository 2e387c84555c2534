"""Every durable step of the store, each a named write boundary with an optional hook.

The chaos rig sets a hook (``set_hook``) in a worker process; the hook runs just before
the step and may record it, kill the process, perform a torn write itself, or raise an
``OSError`` that the step then reports exactly as if the system call had failed. With no
hook set a boundary costs one global load and one ``is None`` test.

OS errors leave this module as ``SessionIOError`` carrying the path and the errno.
"""

from __future__ import annotations

import enum
import errno
import os
import time
from dataclasses import dataclass
from typing import Final, Protocol

from worker.store.errors import SessionIOError
from worker.store.format.dataclass_methods import Value
from worker.store.stats import STATS


class Step(enum.Enum):
    """The kinds of durable step; each call of one is a write boundary."""

    MKDIR = "mkdir"
    CREATE = "create"
    WRITE = "write"
    FSYNC = "fsync"
    RENAME = "rename"
    FSYNC_DIR = "fsync_dir"
    TRUNCATE = "truncate"


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Boundary(Value):
    """One durable step about to happen: what, on which path, and the fd and bytes of a write."""

    step: Step
    path: str
    fd: int | None = None
    data: bytes = b""
    target: str | None = None  # the destination of a rename
    length: int = 0  # the new length of a truncate


class BoundaryHook(Protocol):
    """Called before every durable step; may raise OSError to fail the step."""

    def __call__(self, boundary: Boundary) -> None: ...


_hook: BoundaryHook | None = None

# O_NOFOLLOW: a link planted in a session directory (say ``1.jsonl.tmp`` pointing at a
# file elsewhere) is refused (ELOOP) instead of being truncated or appended to.
_CREATE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
_APPEND_FLAGS: Final = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
_SYNC_FLAGS: Final = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
TMP_SUFFIX: Final = ".tmp"


def set_hook(hook: BoundaryHook | None) -> BoundaryHook | None:
    """Install ``hook`` for this process (None removes it); return the previous one."""
    global _hook
    previous, _hook = _hook, hook
    return previous


def mkdir(path: str) -> None:
    """Make the directory ``path`` (it must not exist)."""
    try:
        if _hook is not None:
            _hook(Boundary(Step.MKDIR, path))
        os.mkdir(path, 0o700)
    except OSError as exc:
        raise SessionIOError(path, exc.errno or 0, "mkdir") from exc


def create(path: str) -> int:
    """Create (or truncate) ``path`` for writing and return its fd."""
    try:
        if _hook is not None:
            _hook(Boundary(Step.CREATE, path))
        return os.open(path, _CREATE_FLAGS, 0o600)
    except OSError as exc:
        raise SessionIOError(path, exc.errno or 0, "create") from exc


def open_append(path: str) -> int:
    """Open an existing file for appending; not a boundary, it changes nothing on disk."""
    try:
        return os.open(path, _APPEND_FLAGS)
    except OSError as exc:
        raise SessionIOError(path, exc.errno or 0, "open") from exc


def write_all(fd: int, data: bytes, path: str) -> None:
    """Write all of ``data`` to ``fd``, looping over short writes."""
    try:
        if _hook is not None:
            _hook(Boundary(Step.WRITE, path, fd, data))
        written = os.write(fd, data)
        STATS.bytes_written += written
        if written == len(data):
            return
        view = memoryview(data)
        while True:
            if written == 0:
                # A zero-byte write of a non-empty buffer makes no progress; looping
                # would spin forever, so report it as the full disk it almost always is.
                raise SessionIOError(path, errno.ENOSPC, "write (no progress)")
            view = view[written:]
            if not view:
                return
            written = os.write(fd, view)
            STATS.bytes_written += written
    except OSError as exc:
        raise SessionIOError(path, exc.errno or 0, "write") from exc


def fdatasync(fd: int, path: str) -> None:
    """Make the data of ``fd`` durable."""
    try:
        if _hook is not None:
            _hook(Boundary(Step.FSYNC, path, fd))
        started = time.perf_counter()
        os.fdatasync(fd)
        STATS.fsync.observe(time.perf_counter() - started)
    except OSError as exc:
        raise SessionIOError(path, exc.errno or 0, "fdatasync") from exc


def fsync_file(path: str) -> None:
    """Make the data of the file ``path`` durable (one already written, e.g. a baseline).

    Open calls this for the files it read: a worker killed before its fsync leaves the
    bytes in the page cache, where the next worker reads them; they must be durable
    before that worker acknowledges anything built on them.
    """
    try:
        if _hook is not None:
            _hook(Boundary(Step.FSYNC, path))
        fd = os.open(path, _SYNC_FLAGS)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise SessionIOError(path, exc.errno or 0, "fdatasync") from exc


def truncate(fd: int, length: int, path: str) -> None:
    """Cut the file of ``fd`` back to ``length`` bytes and make that durable."""
    try:
        if _hook is not None:
            _hook(Boundary(Step.TRUNCATE, path, fd, length=length))
        os.ftruncate(fd, length)
        os.fsync(fd)
    except OSError as exc:
        raise SessionIOError(path, exc.errno or 0, "truncate") from exc


def rename(source: str, target: str) -> None:
    """Rename ``source`` over ``target`` (atomic within one directory)."""
    try:
        if _hook is not None:
            _hook(Boundary(Step.RENAME, source, target=target))
        os.rename(source, target)
    except OSError as exc:
        raise SessionIOError(source, exc.errno or 0, f"rename to {target}") from exc


def fsync_dir(path: str) -> None:
    """Make the entries of directory ``path`` (creates, renames) durable."""
    try:
        if _hook is not None:
            _hook(Boundary(Step.FSYNC_DIR, path))
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise SessionIOError(path, exc.errno or 0, "fsync of directory") from exc


def close(fd: int) -> None:
    """Close ``fd``; not a boundary (data was made durable before)."""
    os.close(fd)


def write_file_atomic(path: str, data: bytes, *, sync_dir: bool = True) -> None:
    """Replace ``path`` with ``data``: tmp in the same directory, write, fsync, rename.

    With ``sync_dir`` the directory is fsynced after the rename, so the new name is
    durable when this returns.
    """
    tmp = path + TMP_SUFFIX
    fd = create(tmp)
    try:
        write_all(fd, data, tmp)
        fdatasync(fd, tmp)
    finally:
        close(fd)
    rename(tmp, path)
    if sync_dir:
        fsync_dir(os.path.dirname(path) or ".")
