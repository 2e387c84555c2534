"""Where an HTTP connection is (``connection.HttpConnection``): the phases of its life."""

from __future__ import annotations

import enum
from typing import Final


class Phase(enum.Enum):
    """Where a connection is: its next request's first byte awaited (IDLE), its head
    (HEAD), its body (BODY), its answer (BUSY), a refusal's lingering, or closed."""

    IDLE = "idle"
    HEAD = "head"
    BODY = "body"
    BUSY = "busy"
    LINGER = "linger"
    CLOSED = "closed"


READING: Final = (Phase.IDLE, Phase.HEAD, Phase.BODY)
"""The phases in which the buffer's bytes are read as the next request."""
