"""Requests relayed through the daemon to a session's worker, and their replies.

A control client's ``send`` or ``compact`` goes to the worker over its control channel
under an id of the daemon's own (the client's id may be any string of up to 256
characters, and two clients may use the same one). The worker's reply is matched by
that id and given back to the waiting client with its own id put back: exactly one
reply per relayed request, whatever happens to the worker.
"""

from __future__ import annotations

from typing import Final

from supervisor.sessions.endpoints import Waiter, WorkerChannel
from worker.ipc.wire import Message, WireError, error

MAX_WORKER_BACKLOG: Final = 8 << 20
"""Bytes queued to a worker that is not reading before new requests are refused (busy)."""


class Relay:
    """The relayed requests of one session that await their worker's reply."""

    def __init__(self, session: str) -> None:
        self.session = session
        self.in_flight: dict[int, Waiter] = {}
        self._next_id = 0

    def __len__(self) -> int:
        return len(self.in_flight)

    def forward(self, link: WorkerChannel, waiter: Waiter, request: Message) -> None:
        """Send a request to the worker; exactly one reply reaches the waiter."""
        if link.backlog > MAX_WORKER_BACKLOG:
            waiter.client.reply(
                error(waiter.request_id, "busy", f"the worker of session {self.session} is "
                      "not reading its requests; retry later")
            )  # fmt: skip
            return
        self._next_id += 1
        try:
            sent = link.send({**request, "id": self._next_id})
        except WireError as exc:
            # Never forwarded: answered here, and no in-flight entry answers it again.
            waiter.client.reply(error(waiter.request_id, "too_large", str(exc)))
            return
        if sent:
            self.in_flight[self._next_id] = waiter
        else:
            waiter.client.reply(
                error(waiter.request_id, "worker_died", f"the worker of session "
                      f"{self.session} is gone; nothing was applied: retry with the same key")
            )  # fmt: skip

    def answer(self, request_id: int | None, message: Message) -> bool:
        """Give the worker's reply to its waiter, under the waiter's own id.

        The client's id may be longer than ours: a reply that then outgrows the frame is
        sent without its big fields (named in ``omitted``), never as ``too_large``, since
        the request was applied. False if no request of ours has this id.
        """
        waiter = self.in_flight.pop(request_id, None) if request_id is not None else None
        if waiter is None:
            return False
        message["id"] = waiter.request_id
        waiter.client.reply_relayed(message)
        return True

    def fail_all(self, code: str, message: str) -> None:
        """Answer every request in flight with an error (the worker died or was stopped)."""
        in_flight, self.in_flight = self.in_flight, {}
        for waiter in in_flight.values():
            waiter.client.reply(error(waiter.request_id, code, message))
