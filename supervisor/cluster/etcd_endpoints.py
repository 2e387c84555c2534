"""The endpoints of an etcd cluster as a URL names them: ``http(s)://host:port[,...]``."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Final

SCHEMES: Final = ("http", "https")
MAX_ENDPOINTS: Final = 16


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One etcd member's client URL."""

    url: str
    scheme: str
    address: tuple[str, int]


def parse_endpoints(url: str) -> list[Endpoint]:
    """Every endpoint of ``url`` (comma-separated); ValueError naming the one that is wrong."""
    parts = [part.strip() for part in url.split(",")]
    if not 1 <= len(parts) <= MAX_ENDPOINTS:
        raise ValueError(f"etcd URL must name 1 to {MAX_ENDPOINTS} endpoints, got {len(parts)}")
    endpoints = []
    for part in parts:
        expected = (
            f"etcd URL must be http://host:port, got {part[:200]!r} (or https://; "
            "several endpoints separated by commas)"
        )
        try:
            parsed = urllib.parse.urlsplit(part)
            port = parsed.port  # ValueError when out of range or not a number
        except ValueError as exc:
            raise ValueError(f"{expected}: {exc}") from exc
        host = parsed.hostname
        if parsed.scheme not in SCHEMES or not host or not host.isascii() or port is None:
            raise ValueError(expected)
        endpoints.append(Endpoint(url=part, scheme=parsed.scheme, address=(host, port)))
    return endpoints
