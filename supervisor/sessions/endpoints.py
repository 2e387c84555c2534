"""The two ends a hosted session talks to: a client waiting for a reply, a worker's channel."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Protocol

from worker.ipc.wire import Message


class Client(Protocol):
    """Where a reply goes (a control connection)."""

    def reply(self, message: Message) -> None: ...
    def reply_relayed(self, message: Message) -> None: ...
    def reply_with_fd(self, message: Message, fd: int) -> bool: ...


class WorkerChannel(Protocol):
    """The daemon's end of a worker's control channel (bounded, never blocking)."""

    @property
    def backlog(self) -> int: ...
    def send(self, message: Message) -> bool: ...
    def send_with_fd(self, message: Message, fd: int) -> bool: ...


@dataclass(slots=True)
class Waiter:
    """A client waiting for a reply: its connection and its request id; for a ``connect``
    from the TLS port, the TCP socket to hand to the worker (the daemon never closes it)
    and the session's tenant, whose clients alone the worker serves on it."""

    client: Client
    request_id: object
    sock: socket.socket | None = None
    owner: str | None = None
