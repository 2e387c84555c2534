"""One HTTP/1.1 POST to etcd's gateway, every byte of it within one total deadline.

A socket timeout bounds one read, not a reply: an etcd (or a proxy in front of it)
that answers one byte a second never trips it. Here each read waits at most until the
call's deadline, whatever arrived before, so a call ends by its deadline, reply or not.
Each call has its own connection (``Connection: close``): nothing is shared between
threads, and no request is ever sent on a connection the server may have dropped.
Name resolution is the system resolver's and is not covered (etcd is named by address).
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable
from typing import Final

from supervisor.cluster.errors import EtcdUnavailable, EtcdUnreached

__all__ = ["MAX_REPLY", "post"]

MAX_REPLY: Final = 64 << 20
_MAX_HEAD: Final = 64 << 10
_READ: Final = 1 << 16


class _Reader:
    """Reads from one socket, each read bounded by what is left of the deadline."""

    def __init__(self, sock: socket.socket, url: str, deadline: float, seconds: float) -> None:
        self.sock = sock
        self.url = url
        self.deadline = deadline
        self.seconds = seconds
        self.buffer = bytearray()
        self.eof = False

    def fill(self) -> bool:
        """Read more; False at end of stream. EtcdUnavailable once the deadline has passed."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self.timed_out()
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(_READ)
        except TimeoutError as exc:
            raise self.timed_out() from exc
        if not data:
            self.eof = True
            return False
        self.buffer += data
        return True

    def timed_out(self) -> EtcdUnavailable:
        return EtcdUnavailable(self.url, f"no whole reply within {self.seconds:g} s")

    def line(self, limit: int) -> bytes:
        """One line ending in CRLF (returned without it)."""
        while (end := self.buffer.find(b"\r\n")) < 0:
            if len(self.buffer) > limit:
                raise EtcdUnavailable(self.url, "a reply line longer than the limit")
            if not self.fill():
                raise EtcdUnavailable(self.url, "the connection closed within a reply")
        line = bytes(self.buffer[:end])
        del self.buffer[: end + 2]
        return line

    def exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            if not self.fill():
                raise EtcdUnavailable(self.url, "the connection closed within a reply")
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data


def post(
    url: str,
    address: tuple[str, int],
    path: str,
    body: bytes,
    *,
    seconds: float,
    take: Callable[[bytes], bool] | None = None,
    context: ssl.SSLContext | None = None,
    connect_within: float | None = None,
) -> tuple[int, bytes]:
    """POST ``body`` to ``path``; return the status and the whole body, within ``seconds``.

    With ``take`` (a streaming call: keepalive, watch) a 200 reply's body is fed to it
    as it arrives, line by line, until it returns True or the deadline passes; then the
    body returned is empty. EtcdUnavailable when etcd cannot be reached, closes early,
    speaks something else than HTTP, or is not done by the deadline; EtcdUnreached (a
    kind of it) when no connection was made within ``connect_within`` (nothing was sent).
    With ``context`` (an ``https://`` endpoint) the connection is TLS, the server's
    certificate checked against the host's name or address.
    """
    deadline = time.monotonic() + seconds
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {address[0]}:{address[1]}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode("ascii")
    s = _connect(url, address, path, deadline, connect_within, context)
    try:
        with s:
            s.settimeout(max(deadline - time.monotonic(), 1e-3))
            s.sendall(head + body)
            reader = _Reader(s, url, deadline, seconds)
            status, chunked, length = _head(reader)
            if take is not None and status == 200:
                _stream(reader, chunked, length, take)
                return status, b""
            return status, _body(reader, chunked, length)
    except TimeoutError as exc:
        raise EtcdUnavailable(url, f"{path}: no whole reply within {seconds:g} s") from exc
    except EtcdUnavailable as exc:
        raise EtcdUnavailable(url, f"{path}: {exc.why}") from exc
    except OSError as exc:
        raise EtcdUnavailable(url, f"{path}: {exc.strerror or exc!r}") from exc


def _connect(
    url: str,
    address: tuple[str, int],
    path: str,
    deadline: float,
    connect_within: float | None,
    context: ssl.SSLContext | None,
) -> socket.socket:
    """A connection to ``address`` (TLS with ``context``), or EtcdUnreached."""
    left = max(deadline - time.monotonic(), 1e-3)
    budget = min(left, connect_within) if connect_within is not None else left
    try:
        raw = socket.create_connection(address, timeout=budget)
    except OSError as exc:
        why = "no connection in time" if isinstance(exc, TimeoutError) else exc.strerror or exc
        raise EtcdUnreached(url, f"{path}: {why}") from exc
    if context is None:
        return raw
    try:
        raw.settimeout(budget)
        return context.wrap_socket(raw, server_hostname=address[0])
    except (OSError, ssl.SSLError) as exc:
        raw.close()
        raise EtcdUnreached(url, f"{path}: TLS with etcd failed: {exc}") from exc


def _head(reader: _Reader) -> tuple[int, bool, int | None]:
    """Read the status line and headers: the status, chunked or not, the length if given."""
    status_line = reader.line(_MAX_HEAD)
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise EtcdUnavailable(reader.url, f"not an HTTP reply: {status_line[:100]!r}")
    status = int(parts[1])
    chunked, length, size = False, None, len(status_line)
    while header := reader.line(_MAX_HEAD):
        size += len(header)
        if size > _MAX_HEAD:
            raise EtcdUnavailable(reader.url, "reply headers over 64 KiB")
        name, _, value = header.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"transfer-encoding":
            chunked = value == b"chunked"
        elif name == b"content-length":
            if not value.isdigit() or int(value) > MAX_REPLY:
                raise EtcdUnavailable(reader.url, f"bad Content-Length {value[:40]!r}")
            length = int(value)
    return status, chunked, length


def _chunks(reader: _Reader, chunked: bool, length: int | None) -> Callable[[], bytes]:
    """A function returning the body's next piece (b"" at its end)."""
    left = [length]

    def next_piece() -> bytes:
        if chunked:
            size_line = reader.line(_MAX_HEAD).split(b";", 1)[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError as exc:
                raise EtcdUnavailable(reader.url, f"bad chunk size {size_line[:40]!r}") from exc
            if size > MAX_REPLY:
                raise EtcdUnavailable(reader.url, "a chunk over the reply limit")
            data = reader.exactly(size)
            reader.exactly(2)  # the CRLF after the chunk (and after the last, empty one)
            return data
        if left[0] is not None:
            if left[0] == 0:
                return b""
            if not reader.buffer and not reader.fill():
                raise EtcdUnavailable(reader.url, "the connection closed within a reply")
            data = reader.exactly(min(left[0], len(reader.buffer)))
            left[0] -= len(data)
            return data
        if not reader.buffer and not reader.fill():
            return b""  # no length: the body ends with the connection
        data = bytes(reader.buffer)
        reader.buffer.clear()
        return data

    return next_piece


def _body(reader: _Reader, chunked: bool, length: int | None) -> bytes:
    pieces, total = [], 0
    next_piece = _chunks(reader, chunked, length)
    while piece := next_piece():
        total += len(piece)
        if total > MAX_REPLY:
            raise EtcdUnavailable(reader.url, "a reply over 64 MiB")
        pieces.append(piece)
    return b"".join(pieces)


def _stream(
    reader: _Reader, chunked: bool, length: int | None, take: Callable[[bytes], bool]
) -> None:
    """Feed the body's lines to ``take`` until it says enough, the body ends, or time is up."""
    next_piece = _chunks(reader, chunked, length)
    pending = bytearray()
    try:
        while piece := next_piece():
            pending += piece
            while (end := pending.find(b"\n")) >= 0:
                line = bytes(pending[: end + 1])
                del pending[: end + 1]
                if line.strip() and take(line):
                    return
            if len(pending) > MAX_REPLY:
                raise EtcdUnavailable(reader.url, "a reply line over 64 MiB")
    except EtcdUnavailable:
        if time.monotonic() < reader.deadline:
            raise
        return  # a stream read up to its deadline: what arrived is the answer
    if pending.strip():
        take(bytes(pending))
