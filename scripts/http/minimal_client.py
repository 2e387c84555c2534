"""The benchmarks' minimal HTTP client: a request in one write, its answer read by length."""

from __future__ import annotations

import socket


def minimal_send(raw: socket.socket, session: str, key: str) -> None:
    """A keyed send of ``hello there`` written in one ``sendall``, its answer read by its
    Content-Length (as curl or Node would, at next to no cost of the client's)."""
    body = b'{"text": "hello there"}'
    raw.sendall(
        f"POST /v1/sessions/{session}/requests HTTP/1.1\r\nHost: bench\r\nContent-Type: "
        f"application/json\r\nIdempotency-Key: {key}\r\nContent-Length: {len(body)}"
        f"\r\n\r\n".encode()
        + body
    )
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = raw.recv(65536)
        if not chunk:
            raise RuntimeError("minimal HTTP send: the connection closed")
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    if not head.startswith(b"HTTP/1.1 200 "):
        raise RuntimeError(f"minimal HTTP send: {head[:100]!r}")
    length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
    while len(rest) < length:
        rest += raw.recv(65536)
