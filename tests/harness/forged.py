"""Logs a forger writes: damaged lines whose checksums are made to match again, so that
only open's (or verify's) checks of what the lines say can refuse them."""

from __future__ import annotations

import zlib


def rechained(lines: list[bytes]) -> bytes:
    """``lines`` (without checksums) with each one's checksum made to match, as a forger would."""
    out, running = b"", 0
    for line in lines:
        head = line[:-1] + b',"crc":"'
        value = zlib.crc32(head, running)
        tail = b'%08x"}\n' % value
        running = zlib.crc32(tail, value)
        out += head + tail
    return out
