"""Forging a session's logs the way a deliberate editor would: checksums made to match.

Tests of the checks behind the checksums (a carried field, a reused call number, a
broken group) change a line and then ``reseal`` the session, so that the checksums do
not refuse the change first: CRC-32 is no defence against a forger, and these checks
are what is left.
"""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

_CRC_SUFFIX = re.compile(rb',"crc":"[0-9a-f]{8}"}$')
_BINDING = re.compile(rb',"prior_log_size":[0-9]+,"prior_log_crc":"[0-9a-f]{8}"')


def chain(lines: list[bytes]) -> bytes:
    """The lines (each without its newline) with every checksum recomputed, each ``\\n``-ended.

    A line that is not a JSON object (``{...}``) is kept as it is, and so is a last
    line given without its newline (a torn write).
    """
    crc = 0
    out = []
    for line in lines:
        body = _CRC_SUFFIX.sub(b"}", line)
        sealed = line
        if body.startswith(b"{") and body.endswith(b"}"):
            head = body[:-1] + b',"crc":"'
            value = zlib.crc32(head, crc)
            sealed = head + b'%08x"}' % value
        out.append(sealed + b"\n")
        crc = zlib.crc32(out[-1], crc)
    return b"".join(out)


def reseal_log(path: Path) -> None:
    """Recompute every checksum of one log (a torn last line stays torn)."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()
    path.write_bytes(chain(lines) + tail)


def reseal(directory: Path) -> None:
    """Recompute every checksum of every log of a session, and every sealed log's binding."""
    logs = sorted(
        (p for p in directory.iterdir() if re.fullmatch(r"[0-9]+\.jsonl", p.name)),
        key=lambda p: int(p.name.split(".")[0]),
    )
    previous: bytes | None = None
    for log in logs:
        data = log.read_bytes()
        if previous is not None:
            first, newline, rest = data.partition(b"\n")
            binding = b',"prior_log_size":%d,"prior_log_crc":"%08x"' % (
                len(previous),
                zlib.crc32(previous),
            )
            data = _BINDING.sub(binding, first, count=1) + newline + rest
        lines = data.split(b"\n")
        tail = lines.pop()
        data = chain(lines) + tail
        log.write_bytes(data)
        previous = data


def rewrite_line(log: Path, index: int, **changes: object) -> None:
    """Change fields of line ``index`` of ``log`` (JSON order kept; a value of None removes
    the field), then reseal its session: a forger's change, the checksums made to match."""
    lines = log.read_bytes().splitlines()
    document = json.loads(lines[index])
    document.pop("crc", None)  # the checksum comes last again
    for name, value in changes.items():
        if value is None:
            del document[name]
        else:
            document[name] = value
    lines[index] = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
    log.write_bytes(b"\n".join(lines) + b"\n")
    reseal(log.parent)


def flip_line(log: Path, line: int) -> None:
    """Make line ``line`` (from 1) of ``log`` undecodable, its length kept (no reseal)."""
    lines = log.read_bytes().split(b"\n")
    lines[line - 1] = b"!" + lines[line - 1][1:]
    log.write_bytes(b"\n".join(lines))
