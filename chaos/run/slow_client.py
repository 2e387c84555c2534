"""The rig as a pipelining client of a real worker: every request it has sent at once.

The worker batches what arrives together and hands it to its App in chunks
(``worker.loop.turns``). After each burst the client sends ``status``, a control message
the worker answers only once every request before it was answered: what is still
unanswered then was dropped. ``pipelined-answered-in-order``: each request of a burst
is answered once, in the order sent, with its own key, before that barrier. A request
answered out of turn or dropped is recorded, then sent again alone, as a client whose
reply never came retries by key, so the session still ends whole and only this check
sees it.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Final

from chaos.run.requests_client import RequestsClient
from worker.ipc.wire import Message, encode

ORDER: Final = "pipelined-answered-in-order"
_BARRIER: Final = 1 << 30  # the id of the status that follows a burst
_MAX_TRIES: Final = 2  # a request that failed this often is not sent again


@dataclass(slots=True)
class PipelinedClient(RequestsClient):
    """Sends every pending request in one burst; then the unanswered ones again."""

    outstanding: list[tuple[int, str]] = field(default_factory=list)  # (id, key), in order
    again: list[str] = field(default_factory=list)  # keys to send in the next burst
    attempts: dict[str, int] = field(default_factory=dict)
    next_id: int = 1

    def _on_message(self, message: Message) -> None:
        op = message.get("op")
        if op == "ready":
            self.log.started = True
            self.log.checks.add(ORDER)
            self.on_ready(message)
            self.again = [key for key, _ in self.pending]
            self._burst()
            return
        if op == "exiting":
            self.on_refused(
                {"e": "refused", "error": message.get("code"), "why": message.get("message")}
            )
            return
        if message.get("id") == _BARRIER:
            self._barrier()
        elif message.get("id") != 0:  # 0: the answer to stop
            self._reply(message)

    def _reply(self, message: Message) -> None:
        ids = [request_id for request_id, _ in self.outstanding]
        answered = message.get("id")
        if not isinstance(answered, int) or answered not in ids:
            self.log.problem(ORDER, f"a reply to no request in flight: {message!r:.200}")
            return
        at = ids.index(answered)
        _answered, key = self.outstanding.pop(at)
        for _skipped_id, skipped in self.outstanding[:at]:
            self.log.problem(ORDER, f"request {skipped!r} was overtaken by {key!r}, sent after it")
        result = message.get("result")
        if message.get("ok") is True and isinstance(result, dict):
            if result.get("key") != key:
                self.log.problem(ORDER, f"request {key!r} was answered for {result.get('key')!r}")
            state = result.get("state")
            epoch = state.get("epoch", 0) if isinstance(state, dict) else 0
            self.log.answers.setdefault(key, result)
            self.log.ack(key, int(str(epoch)))
            return
        error = message.get("error")
        if self.on_error is not None:
            self.on_error(key, error.get("code") if isinstance(error, dict) else error)
        self.again.append(key)  # a client retries a failed request by its key

    def _barrier(self) -> None:
        """Every request of the burst was answered by now, or it was dropped."""
        for _request_id, key in self.outstanding:
            self.log.problem(ORDER, f"request {key!r} got no reply before a later status")
            self.again.append(key)
        self.outstanding.clear()
        self._burst()

    def _burst(self) -> None:
        """Send the requests to send again in one write, then the barrier; or stop."""
        texts = dict(self.scenario.requests)
        keys = [k for k in dict.fromkeys(self.again) if k not in self.log.acked]
        keys = [k for k in keys if self.attempts.get(k, 0) < _MAX_TRIES]
        self.again = []
        if not keys:
            self._write([{"id": 0, "op": "stop"}])
            return
        messages: list[Message] = []
        for key in keys:
            self.attempts[key] = self.attempts.get(key, 0) + 1
            self.log.start(key)
            self.outstanding.append((self.next_id, key))
            messages.append({"id": self.next_id, "op": "request",
                             "request": {"text": texts[key], "key": key}})  # fmt: skip
            self.next_id += 1
        self._write([*messages, {"id": _BARRIER, "op": "status"}])

    def _write(self, messages: list[Message]) -> None:
        # One write: the worker reads the burst together and batches it.
        try:
            self.channel.sock.sendall(b"".join(encode(m) for m in messages), socket.MSG_NOSIGNAL)
        except OSError:
            return  # the worker died; its end of stream ends the loop
