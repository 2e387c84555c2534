"""One HTTP/1.1 request's head, read as strictly as RFC 9112 asks (the connection's
bytes are ``connection.HttpConnection``'s).

What is refused, each with one error and the connection closed after it (a parser that
guessed could be desynchronised from a proxy in front of it: request smuggling):
a request line that is not ``METHOD SP /target SP HTTP/1.1``, a head over
``MAX_HEAD`` bytes or ``MAX_HEADERS`` lines, a header line with whitespace before its
colon, a folded line, a control character, a missing or repeated ``Host``, any
``Transfer-Encoding`` (no chunked bodies), more than one ``Content-Length`` or one that
is not digits, and a body over ``MAX_BODY``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

MAX_HEAD: Final = 8 << 10
"""Bytes of the request line and headers together, the final blank line included."""
MAX_HEADERS: Final = 64
MAX_BODY: Final = 1 << 20
"""A request body, at most: the control socket's frame."""
HEADER_DEADLINE: Final = 5.0
"""Seconds from a request's first byte to the end of its head: a peer that trickles its
headers is answered 408 and closed."""
KEEP_ALIVE_IDLE: Final = 5.0
"""Seconds a connection may wait for its next request's first byte; then it is closed
without a word (no request began, so none is answered)."""
BODY_DEADLINE: Final = 30.0
"""Seconds from the end of a request's head to the end of its body: a slow upload of up
to ``MAX_BODY`` is served, a stalled one answered 408 and closed."""

_TOKEN: Final = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET: Final = re.compile(rb"/[\x21-\x7e]*")
_VALUE: Final = re.compile(rb"[\x20-\x7e\x80-\xff\t]*")
_HEADER_LINES: Final = re.compile(rb"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\x20-\x7e\x80-\xff\t]*\r\n)*")
"""Every header line at once: ``_TOKEN``, a colon, a value of ``_VALUE``'s bytes, CRLF."""


class HttpError(Exception):
    """A request refused: the status, the wire protocol's code and one line why."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(status, code, message)
        self.status = status
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpRequest:
    """A request as read: method, target, lower-cased header names, the body."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection")
        if connection is None:
            return True
        tokens = connection.lower().split(",")
        return "close" not in (t.strip() for t in tokens)


def body_length(headers: dict[str, str]) -> int:
    """The body's length its headers give (0 without Content-Length); HttpError if it is
    not one number, or over ``MAX_BODY``."""
    length = _content_length(headers)
    if length > MAX_BODY:
        raise HttpError(413, "too_large", f"a body of {length} bytes (at most {MAX_BODY})")
    return length


def parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """Method, target and headers of a head ending in CRLF CRLF; HttpError if not strict."""
    if len(head) > MAX_HEAD:
        raise HttpError(431, "too_large", f"a request head over {MAX_HEAD} bytes")
    lines = head[:-4].split(b"\r\n")
    if len(lines) - 1 > MAX_HEADERS:
        raise HttpError(431, "too_large", f"more than {MAX_HEADERS} header lines")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not _TARGET.fullmatch(parts[1]):
        raise HttpError(400, "bad_request", "a request line other than METHOD /target HTTP/1.1")
    if parts[2] != b"HTTP/1.1":
        raise HttpError(505, "bad_request", "only HTTP/1.1 is served")
    # One match checks every line at once (a C loop, not two matches a line); only when
    # it fails is each line checked in turn, for the first failure's own error.
    checked = _HEADER_LINES.fullmatch(head, len(lines[0]) + 2, len(head) - 2) is not None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not checked and (not colon or not _TOKEN.fullmatch(name)):
            # Also a folded line (leading whitespace) and "Name : value" (RFC 9112 5.1).
            raise HttpError(400, "bad_request", "a header line that is not Name: value")
        value = value.strip(b" \t")
        if not checked and not _VALUE.fullmatch(value):
            raise HttpError(400, "bad_request", "a control character in a header value")
        key = name.decode("ascii").lower()
        if key in headers and key in _SINGLE:
            raise HttpError(400, "bad_request", f"more than one {key} header")
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    if "transfer-encoding" in headers:
        raise HttpError(400, "bad_request", "Transfer-Encoding is refused: send Content-Length")
    if "host" not in headers:
        raise HttpError(400, "bad_request", "no Host header")
    return parts[0].decode("ascii"), parts[1].decode("ascii"), headers


_SINGLE: Final = frozenset({"content-length", "host", "idempotency-key", "last-event-id"})
"""Headers that appear once or not at all (a second is refused, never merged)."""


def _content_length(headers: dict[str, str]) -> int:
    value = headers.get("content-length")
    if value is None:
        return 0
    if not value.isascii() or not value.isdigit() or len(value) > 19:
        raise HttpError(400, "bad_request", "a Content-Length that is not one number")
    return int(value)
