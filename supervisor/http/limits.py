"""The bounds of one connection of the HTTP port (supervisor/http/connection.py), and of
how many connections it holds at once (docs/http.md, "Bounds")."""

from __future__ import annotations

from typing import Final

from supervisor.http.parser import MAX_HEAD, HttpError

MAX_CONNECTIONS: Final = 2048
"""Connections at once; one more is answered 503 and closed. Each holds at most its
buffer (a request's head and body, or ``BUFFERED_WHILE_BUSY`` while one is answered or
writing is paused, and one read of the transport's beyond either) and its transport's
(past 64 KiB reading pauses; one answer can take it past that)."""
MAX_REQUESTS_PER_CONNECTION: Final = 1000
"""Requests a connection serves; the last one is answered ``Connection: close``."""
LINGER: Final = 2.0
"""Seconds an answered refusal waits for the peer's unread bytes (at most
``LINGER_BYTES``) before closing: closing with unread input sends a reset, which can
destroy the refusal before the peer reads it."""
LINGER_BYTES: Final = 4 << 20
WRITE_STALL: Final = 30.0
"""Seconds serve's unsent bytes to a connection may wait with the peer taking none of
them (while writing is paused, or after serve closed its side): then the connection is
aborted, so that a client that stopped reading holds no descriptor and no slot."""
BUFFERED_WHILE_BUSY: Final = 2 * MAX_HEAD
"""Bytes read ahead while a request is answered, at most; then reading pauses."""
INTERNAL: Final = HttpError(500, "internal", "serve failed to answer this request")
"""The answer to an error on a request's path other than an HttpError (its name and
stack go to serve's log, not to the client: they may name the home's paths)."""
