"""Responses: status lines, JSON bodies, errors as one object, the wire codes' statuses."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Final, Protocol

STATUS_OF_CODE: Final = {
    "bad_request": 400,
    "bad_frame": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "exists": 409,
    "intent": 409,
    "unknown_app": 400,
    "too_large": 413,
    "busy": 429,
    "unavailable": 503,
    "no_daemon": 503,
    "closed": 503,
    "worker_died": 503,
    "not_ours": 503,
    "not_owner": 503,
    "DatabaseUnavailable": 503,  # the store's database is away: sent again by key, applied once
    "LostBeforeWrite": 503,
    "OutcomeUnknown": 503,
    "timeout": 504,
}
"""The HTTP status of each wire protocol error code; any other code is a 500."""


class Writer(Protocol):
    """Where a request's answer is written: its connection (``connection.HttpConnection``)."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None:
        """Return once the connection takes more (ConnectionResetError if it is gone)."""


def status_of(code: str) -> int:
    return STATUS_OF_CODE.get(code, 500)


def json_body(document: object) -> bytes:
    """A JSON document as sent; a value JSON lacks (bytes from msgpack) becomes its repr."""
    return _ENCODER.encode(document).encode("utf-8")


_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, default=repr)
"""``json.dumps`` with these options makes an encoder a call: one, made once."""


def error_document(code: str, message: str) -> dict[str, object]:
    return {"error": {"code": code, "message": message}}


def response(
    status: int,
    body: bytes,
    *,
    content_type: str = "application/json",
    keep_alive: bool = True,
    extra: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """The whole response: status line, headers with Content-Length, body."""
    reason = _REASONS.get(status) or HTTPStatus(status).phrase
    connection = "keep-alive" if keep_alive else "close"
    more = "".join(f"{name}: {value}\r\n" for name, value in extra) if extra else ""
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: {connection}\r\n{more}\r\n"
    )
    return head.encode("latin-1") + body


_REASONS: Final = {200: "OK", 201: "Created"}
"""The answers of nearly every request: their reason phrases without an Enum call."""


def error_response(
    status: int,
    code: str,
    message: str,
    *,
    keep_alive: bool = True,
    extra: tuple[tuple[str, str], ...] = (),
) -> bytes:
    return response(
        status, json_body(error_document(code, message)), keep_alive=keep_alive, extra=extra
    )


EVENT_STREAM_HEAD: Final = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n"
    b"Connection: close\r\n\r\n"
)
"""An event stream's head: no length, the body ends when the connection closes."""
