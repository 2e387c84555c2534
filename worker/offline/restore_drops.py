"""What a restore over a session drops: the session's records its backup does not hold.

A backup holds what was acknowledged before its point; a session restored over with
``--force`` loses what was acknowledged after it. Before it replaces anything, restore
names that work: each line of the session's logs that the backup's log of the same
epoch does not hold (the lines after the backup's point, every line of a later epoch,
a damaged line), and the keys of its User records the backup holds nowhere. A token
(a digest of those lines) lets the operator confirm exactly that set: a session that
acknowledged more since it was listed no longer matches, and is not replaced.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from typing import Final

from worker.store.disk.files import open_directory, read_file
from worker.store.errors import SessionError, SessionNotFound
from worker.store.format.records import User, decode_line

_LOG: Final = re.compile(r"(0|[1-9][0-9]*)\.jsonl")
TOKEN_CHARS: Final = 12


@dataclass(frozen=True, slots=True, kw_only=True)
class Drop:
    """The session's records a restore drops; ``token`` names exactly this set."""

    records: int  # lines of the session's logs the backup does not hold
    keys: tuple[str, ...]  # keys of those User records that the backup holds nowhere
    undecodable: int  # of those lines, how many do not decode (any key in them unknown)
    token: str

    def describe(self) -> str:
        """``4 records (2 keys)``, and the undecodable lines if any."""
        keys = "1 key" if len(self.keys) == 1 else f"{len(self.keys)} keys"
        unknown = f", {self.undecodable} undecodable" if self.undecodable else ""
        return f"{self.records} record{'s' if self.records != 1 else ''} ({keys}{unknown})"


class DropNotConfirmed(SessionError):
    """Replacing the session would drop work the operator has not confirmed."""

    def __init__(self, path: str, drop: Drop) -> None:
        super().__init__(path, drop)
        self.path = path
        self.drop = drop

    def __str__(self) -> str:
        return (
            f"{self.path}: holds {self.drop.describe()} acknowledged after the backup's point, "
            f"which restoring drops; not confirmed (their token is {self.drop.token})"
        )


NOTHING: Final = Drop(records=0, keys=(), undecodable=0, token="")


def work_dropped(directory: str, backup: dict[str, bytes]) -> Drop:
    """What restoring ``backup`` (its files by name) over ``directory`` would drop.

    Reads the session's logs without its lock (a listing for the operator); a restore
    reads them again under the lock before it moves anything.
    """
    try:
        fd = open_directory(directory)
    except SessionNotFound:
        return NOTHING  # no session there: nothing to drop
    try:
        logs = sorted((int(m[1]), m[0]) for m in map(_LOG.fullmatch, os.listdir(fd)) if m)
        dropped: list[bytes] = []
        for epoch, name in logs:
            held = set(backup.get(name, b"").split(b"\n"))
            data = read_file(fd, name, os.path.join(directory, name))
            lines = data.split(b"\n")
            if lines[-1] == b"":
                lines.pop()
            dropped += [b"%d:" % epoch + line for line in lines if line not in held]
    finally:
        os.close(fd)
    if not dropped:
        return NOTHING
    kept_keys = {
        key
        for name, data in backup.items()
        if _LOG.fullmatch(name)
        for line in data.split(b"\n")
        if (key := _key(line)) is not None
    }
    keys: list[str] = []
    undecodable = 0
    for line in dropped:
        body = line.split(b":", 1)[1]
        key = _key(body)
        undecodable += key is _UNDECODABLE
        if key is not None and key is not _UNDECODABLE and key not in kept_keys and key not in keys:
            keys.append(key)
    digest = hashlib.sha256(b"\n".join(dropped)).hexdigest()[:TOKEN_CHARS]
    return Drop(records=len(dropped), keys=tuple(keys), undecodable=undecodable, token=digest)


_UNDECODABLE: Final = "\0undecodable"  # never a key: a key is printable


def _key(line: bytes) -> str | None:
    """The key of a User record's line; None for another record; _UNDECODABLE."""
    try:
        record, _part = decode_line(line)
    except ValueError:
        return _UNDECODABLE
    return record.key if isinstance(record, User) and record.key else None
