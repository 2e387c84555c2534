"""What the supervisor and a template say to each other, and its encoding.

One message per SOCK_SEQPACKET datagram, a msgpack map: the supervisor sends a ForkOrder
with the worker's descriptors beside it (SCM_RIGHTS); the template says what it did
(Said). No other module touches these bytes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final

import msgpack

MAX_MESSAGE: Final = 1 << 20
"""Bytes of one message (an order's environment is the largest part)."""
ORDER_FDS: Final = 3
"""Descriptors an order carries at most: the channel, the heartbeat cell, the output pipe."""
CHANNEL_FD: Final = 3
HEARTBEAT_FD: Final = 4
"""Where a template-forked worker finds its channel and heartbeat cell (its argv says so)."""


class OrderError(Exception):
    """A message that is not one of the protocol's (a bug or a stranger on the socket)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ForkOrder:
    """Fork one worker: its arguments (``python -m worker`` without the interpreter),
    environment, working directory and import path; the descriptors come beside it."""

    session: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    path: tuple[str, ...] = ()

    def encode(self) -> bytes:
        return bytes(
            msgpack.packb(
                {
                    "session": self.session,
                    "argv": list(self.argv),
                    "env": self.env,
                    "cwd": self.cwd,
                    "path": list(self.path),
                }
            )
        )

    @classmethod
    def decode(cls, data: bytes) -> ForkOrder:
        try:
            raw = msgpack.unpackb(data)
            return cls(
                session=str(raw["session"]),
                argv=tuple(str(a) for a in raw["argv"]),
                env={str(k): str(v) for k, v in raw["env"].items()},
                cwd=None if raw["cwd"] is None else str(raw["cwd"]),
                path=tuple(str(p) for p in raw["path"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise OrderError(f"not a fork order: {exc}") from exc


class SaidKind(enum.Enum):
    READY = "ready"
    """The App imported and its factory resolved; orders are taken from now on (``text``:
    what of the files its import read is not watched, if anything)."""
    FAILED = "failed"
    """The App did not import (``text`` is the one-line error); the template ends."""
    THREADS = "threads"
    """The App's import started threads (``text`` names them): forking it is refused."""
    HOLDS = "holds"
    """The App's import left descriptors open or processes running (``text`` names them):
    forking it is refused (a worker's own descriptors would land on those numbers)."""
    FORKED = "forked"
    """A worker was forked (``pid``); it is the supervisor's child already."""
    FORK_FAILED = "fork_failed"
    """No worker was forked (``text``: the OS error)."""
    STALE = "stale"
    """No worker was forked: a file the App's import read changed since (``text``); the
    template ends, so that the next one imports the App as it is now."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Said:
    """What a template says: its readiness once, then one answer per order."""

    kind: SaidKind
    pid: int | None = None
    text: str = ""

    def encode(self) -> bytes:
        # A text may hold a path's bytes that are no UTF-8 (surrogates, as os.fsdecode
        # makes them), which msgpack cannot encode: sent escaped, never raised.
        text = self.text.encode("utf-8", "backslashreplace").decode("utf-8")
        return bytes(msgpack.packb({"kind": self.kind.value, "pid": self.pid, "text": text}))

    @classmethod
    def decode(cls, data: bytes) -> Said:
        try:
            raw = msgpack.unpackb(data)
            pid = raw["pid"]
            return cls(
                kind=SaidKind(raw["kind"]),
                pid=None if pid is None else int(pid),
                text=str(raw["text"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise OrderError(f"not a template's message: {exc}") from exc


@dataclass(frozen=True, slots=True, kw_only=True)
class AppIdentity:
    """What makes two workers' Apps one template's: the target and where it imports from.

    A template is forked from the supervisor, so it gets this record itself (no bytes).
    """

    app: str
    """``module:attribute``."""
    path: tuple[str, ...] = ()
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    """The workers' extra environment (without the store), sorted: part of the identity
    because an App may read it at import."""

    def label(self) -> str:
        """How the operator's messages name it."""
        return self.app if self.cwd is None else f"{self.app} (cwd {self.cwd})"
