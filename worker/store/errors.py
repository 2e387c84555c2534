"""The session store's error family: one root, a few subclasses that carry fields.

Every class passes all of its fields to ``super().__init__`` so that an error pickles
across processes and ``args`` rebuilds it exactly.
"""

from __future__ import annotations

import errno as errno_codes
import os
from typing import Final

QUOTE_LIMIT: Final = 200
"""How many characters of a bad value an error text quotes before cutting it with ``...``."""


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """Return ``repr(value)`` cut to about ``limit`` characters, so no error text grows unbounded.

    A log line or a request can hold megabytes; quoting it whole would make one error
    larger than a wire frame and an operator's terminal. A cut value ends in ``...``
    and says how long it was.
    """
    if isinstance(value, str | bytes) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} characters)"
    text = repr(value)
    if len(text) > limit:
        return f"{text[:limit]}... ({len(text)} characters)"
    return text


class SessionError(Exception):
    """Root of every error the session store raises."""


class InvalidSessionId(SessionError):
    """The session id is not 1-64 characters of [A-Za-z0-9._-] starting with [A-Za-z0-9_]."""

    def __init__(self, session_id: str, why: str) -> None:
        super().__init__(session_id, why)
        self.session_id = session_id
        self.why = why

    def __str__(self) -> str:
        return f"invalid session id {quote(self.session_id)}: {self.why}"


class SessionExists(SessionError):
    """``create`` found the session directory already there."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path

    def __str__(self) -> str:
        return f"{self.path}: session already exists"


class SessionNotFound(SessionError):
    """``open`` found no ``0.jsonl`` in the session directory."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path

    def __str__(self) -> str:
        return f"{self.path}: no such session (no 0.jsonl)"


class SessionLocked(SessionError):
    """Another open file description holds the session's exclusive lock."""

    def __init__(self, path: str, pid: int | None) -> None:
        super().__init__(path, pid)
        self.path = path
        self.pid = pid

    def __str__(self) -> str:
        holder = f"process {self.pid}" if self.pid is not None else "another process"
        return f"{self.path}: session is locked by {holder}"


class SessionIOError(SessionError):
    """An OS call of the store failed; carries the path it concerned and the errno."""

    def __init__(self, path: str, errno: int, operation: str) -> None:
        super().__init__(path, errno, operation)
        self.path = path
        self.errno = errno
        self.operation = operation

    def __str__(self) -> str:
        name = errno_codes.errorcode.get(self.errno, str(self.errno))
        return f"{self.path}: {self.operation} failed: [{name}] {os.strerror(self.errno)}"

    def fills(self, directory: str) -> bool:
        """ENOSPC or EDQUOT on a file under ``directory`` (a home's full disk; not an App's
        own file elsewhere, whose error stays its own)."""
        if self.errno not in (errno_codes.ENOSPC, errno_codes.EDQUOT):
            return False
        top = os.path.abspath(directory)
        return os.path.commonpath([os.path.abspath(self.path), top]) == top


class PathError(SessionError):
    """An error about one path; ``str()`` is ``<path>: <why>``."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(path, why)
        self.path = path
        self.why = why

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


class UnsafeFile(PathError):
    """A session's file or directory is a link, a FIFO, a device or a directory: never read."""


class SessionBroken(PathError):
    """The session refused an append because an earlier write or fsync failed."""

    def __str__(self) -> str:
        return f"{self.path}: session is broken and refuses appends: {self.why}"


class LogError(SessionError):
    """A log was refused at a known place; ``str()`` is exactly ``<path>:<line>: <why>``."""

    def __init__(self, path: str, line: int, why: str) -> None:
        super().__init__(path, line, why)
        self.path = path
        self.line = line
        self.why = why

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.why}"


class TornLog(LogError):
    """A line does not end in a newline or does not decode as a known record."""


class InvalidLog(LogError):
    """The records decode but break the log's structure (SessionStart, EpochEnd, epochs)."""


class ChecksumMismatch(InvalidLog):
    """A line's checksum, or a sealed log's length and CRC-32, is not what the writer wrote.

    Damage after the write (a flipped byte, a line deleted, duplicated, moved, or cut
    off a sealed log), never a crash: nothing repairs it in place.
    """


class KeyIndexFileError(InvalidLog):
    """A key index file a SessionStart names is missing or hashes otherwise (the line names it).

    The index is derived from the logs: ``loopd repair`` rebuilds it from them.
    """


class BaselineError(PathError):
    """The epoch's baseline is missing, unparsable, or does not hash to SessionStart.baseline."""


class EpochClosed(SessionError):
    """An append came after the epoch's EpochEnd; only ``commit_epoch`` may follow."""

    def __init__(self, path: str, epoch: int) -> None:
        super().__init__(path, epoch)
        self.path = path
        self.epoch = epoch

    def __str__(self) -> str:
        return f"{self.path}: epoch {self.epoch} is closed by EpochEnd; commit_epoch first"


class LogSealed(SessionError):
    """A write came after the log's ``Handoff``: the session moved (docs/scaling.md)."""

    def __init__(self, path: str, to: str, token: int) -> None:
        super().__init__(path, to, token)
        self.path = path
        self.to = to
        self.token = token

    def __str__(self) -> str:
        return (
            f"{self.path}: sealed by Handoff to {self.to!r} (token {self.token}); "
            "only the new owner's Owner record may follow"
        )


class NotOwnerNow(SessionError):
    """A cluster worker may not write: its lease is not proven, or its log is newer (fencing)."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(path, why)
        self.path = path
        self.why = why

    def __str__(self) -> str:
        return f"{self.path}: not the owner now: {self.why}"


class KeyExpired(SessionError):
    """Never raised any more: every key of a session is found (the key index).

    A keyed request was once refused with it when its key had left a retry window of
    two epochs. It stays defined so that code naming it (an App, the worker's error
    codes) still imports; nothing in the store raises it.
    """

    def __init__(self, key: str, seen_epoch: int, epoch: int) -> None:
        super().__init__(key, seen_epoch, epoch)
        self.key = key
        self.seen_epoch = seen_epoch
        self.epoch = epoch

    def __str__(self) -> str:
        return (
            f"request key {quote(self.key, 80)} has left the retry window: it was first sent "
            f"when the session was at epoch {self.seen_epoch}, it is now at epoch {self.epoch}, "
            "and only the keys of the current and the previous epoch are indexed. It may "
            "have been applied; look for it with `loopd inspect --all` before sending it "
            "again under a new key"
        )


class InvalidRecord(SessionError, ValueError):
    """A record handed to ``append`` cannot be written as a valid log line."""

    def __init__(self, record_type: str, why: str) -> None:
        super().__init__(record_type, why)
        self.record_type = record_type
        self.why = why

    def __str__(self) -> str:
        return f"invalid {self.record_type} record: {self.why}"


LOG_REFUSED: tuple[type[SessionError], ...] = (TornLog, InvalidLog, BaselineError, UnsafeFile)
"""The errors that mean "the log on disk is refused" (the worker's distinct exit code)."""
