"""The checksum chain of a log's lines, and the binding of a sealed log to the next epoch.

Every line the store writes ends with ``"crc":"N"``: N, 8 lowercase hex digits, is the
CRC-32 (``zlib.crc32``) of every byte of the log before N, the earlier lines whole and
this line up to ``"crc":"``. So each checksum covers its own line and, through the bytes before it,
every earlier line and its checksum: a changed byte, a deleted, duplicated or moved
line is caught at the first line whose checksum no longer matches. A log written
before checksums has none; once a line has one, every later line must (the store
writes a checksum on every line it appends, to old logs too).

A sealed log is bound to what follows: the next epoch's ``SessionStart`` records its
length and the CRC-32 of all its bytes (``prior_log_size``, ``prior_log_crc``), so a
sealed log cut at a line boundary, which every line's own checksum would pass, is
refused too. Mismatches are ``ChecksumMismatch`` (an ``InvalidLog``) at their line.
"""

from __future__ import annotations

import zlib
from typing import Final

from worker.store.errors import ChecksumMismatch
from worker.store.format.records import SessionStart

_CRC_FIELD: Final = b',"crc":"'


def chain_line(path: str, number: int, line: bytes, stored: str | None, running: int,
               summed_from: int) -> int:  # fmt: skip
    """Check line ``number`` (without its newline) against the log's CRC-32 before it.

    ``running`` is the CRC-32 of the log's bytes before this line, ``stored`` the line's
    checksum (None: it has none), ``summed_from`` the first line with one (0: none
    yet). Returns the CRC-32 of the log through this line's newline.
    """
    if stored is None:
        if summed_from:
            raise ChecksumMismatch(
                path,
                number,
                f"line has no checksum, but line {summed_from} and every line after it up "
                "to here have one: not a line the store wrote",
            )
        return zlib.crc32(b"\n", zlib.crc32(line, running))
    at = line.rfind(_CRC_FIELD) + len(_CRC_FIELD)
    value = zlib.crc32(line[:at], running)
    if f"{value:08x}" != stored:
        raise ChecksumMismatch(
            path,
            number,
            f"checksum mismatch: the line says crc {stored}, the log up to it gives "
            f"{value:08x}: "
            "this line is not what was written, or a line before it was deleted, duplicated "
            "or moved",
        )
    return zlib.crc32(b"\n", zlib.crc32(line[at:], value))


def sealed_binding(start: SessionStart) -> tuple[int, str] | None:
    """The previous log's (length, CRC-32) a SessionStart records; None if it has none."""
    if start.prior_log_size is None or start.prior_log_crc is None:
        return None
    return start.prior_log_size, start.prior_log_crc


def sealed_intact(data: bytes, binding: tuple[int, str] | None) -> bool:
    """True if the sealed log's bytes are the length and CRC-32 recorded (or none was)."""
    return binding is None or (len(data) == binding[0] and f"{zlib.crc32(data):08x}" == binding[1])


def refuse_sealed(path: str, data: bytes, binding: tuple[int, str], epoch: int) -> None:
    """Raise for a sealed log whose lines all check but whose length or CRC-32 do not.

    ``epoch`` is the epoch whose SessionStart recorded ``binding``.
    """
    size, crc = binding
    lines = data.count(b"\n")
    recorded = f"epoch {epoch}'s SessionStart recorded {size} bytes, CRC-32 {crc}"
    if len(data) < size:
        raise ChecksumMismatch(
            path,
            lines + 1,
            f"the sealed log ends after line {lines} ({len(data)} bytes), but {recorded} "
            "when it was sealed: lines were cut off its end",
        )
    if len(data) > size:
        raise ChecksumMismatch(
            path,
            data.count(b"\n", 0, size) + 1,
            f"the sealed log is {len(data)} bytes, but {recorded} when it was sealed: "
            "bytes were added after its end",
        )
    raise ChecksumMismatch(
        path,
        1,
        f"the sealed log's CRC-32 is {zlib.crc32(data):08x}, but {recorded} when it was "
        "sealed: it changed since (its lines carry no checksum of their own to say where)",
    )
