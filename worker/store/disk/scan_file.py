"""Where a session's scan summary is kept: ``<home>/scans/<id>.scan``, a cache.

The summary (``worker.store.format.scan_summary``) lets the next open scan only the
lines written after it. It is no part of the session's state: the session directory
holds none of it (a move, a backup, a fork or a salvage never carries one), nothing is
fsynced, and a summary that is missing, unreadable, damaged or of other bytes costs the
next open a whole scan and nothing else. Only the worker holding the session's lock
writes it (after an open that scanned enough to be worth keeping, and as its log grows:
``worker.store.format.kept_scan``), with a temporary file renamed into place, so a
reader finds a whole summary or none.
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import Final

from worker.store.format.scan_summary import ScanSummary, decode

SCANS_DIR: Final = "scans"
MAX_BYTES: Final = 64 << 20  # a byte a line, 8 a call, a key's JSON: more is not one
_READ: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# Always a new file (O_EXCL): never a FIFO or a link someone put at the name.
_WRITE: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def scan_path(home: str | os.PathLike[str], session_id: str) -> str:
    """``<home>/scans/<id>.scan`` (``session_id`` already validated by the caller)."""
    return os.path.join(os.fspath(home), SCANS_DIR, f"{session_id}.scan")


def temporary_path(home: str | os.PathLike[str], session_id: str) -> str:
    """The temporary name of the session's summary while it is written: ``.<id>.scan.tmp``."""
    return os.path.join(os.fspath(home), SCANS_DIR, f".{session_id}.scan.tmp")


def read_summary(home: str | os.PathLike[str], session_id: str) -> ScanSummary | None:
    """The session's scan summary, or None (none kept, or not one to take)."""
    try:
        fd = os.open(scan_path(home, session_id), _READ)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_BYTES:
            return None
        blob = os.read(fd, info.st_size + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return decode(blob)


def write_summary(home: str | os.PathLike[str], session_id: str, blob: bytes) -> bool:
    """Put ``blob`` in place as the session's summary; False if it could not be (a cache:
    the next open then scans the whole log, as it does without one)."""
    path = scan_path(home, session_id)
    temporary = temporary_path(home, session_id)
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = _create(temporary)
    except OSError:
        return False
    try:
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.rename(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        return False
    return True


def _create(temporary: str) -> int:
    """A new file at ``temporary``; one left there (a writer killed before its rename, or
    anything else) is removed first, never opened: a FIFO or a link there is harmless."""
    try:
        return os.open(temporary, _WRITE, 0o600)
    except FileExistsError:
        os.unlink(temporary)
        return os.open(temporary, _WRITE, 0o600)


def forget_summary(home: str | os.PathLike[str], session_id: str) -> None:
    """Remove the session's summary, if there is one (its session is gone or replaced)."""
    with contextlib.suppress(OSError):
        os.unlink(scan_path(home, session_id))
