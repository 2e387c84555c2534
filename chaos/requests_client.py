"""The rig as the client of a real worker: requests in order, replies as acknowledgements."""

from __future__ import annotations

import json
import os
import selectors
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from chaos.oracle import ClientLog
from chaos.scenarios import Scenario
from worker.wire import Channel, Message

_COMPACT: Final = "\0compact"  # what ``sent`` holds while the operator's compact is out


@dataclass(slots=True)
class RequestsClient:
    """Sends the scenario's keyed requests one at a time; a failed one is retried once.

    A scenario with ``compact`` has the operator compact with its own summary once the
    request it names is acknowledged.

    ``on_event`` gets the worker's trace events, ``on_ready`` gets the worker's ready
    message (the rig's second-writer probe and its state check), ``on_refused`` runs when
    it says it exits.
    """

    scenario: Scenario
    log: ClientLog
    channel: Channel
    on_event: Callable[[dict[str, object]], None]
    on_ready: Callable[[Message], None]
    on_refused: Callable[[dict[str, object]], None]
    resend: bool = False  # send every request again, answered or not; no compact, no retry
    pending: list[tuple[str, str]] = field(default_factory=list)
    sent: str | None = None
    tries: int = 0

    def run(self, event_fd: int) -> None:
        """Serve until both the trace and the channel reach their end."""
        # A client never sends again what it was told is done: only what got no answer.
        self.pending = [
            r for r in self.scenario.requests if self.resend or r[0] not in self.log.acked
        ]
        selector = selectors.DefaultSelector()
        selector.register(event_fd, selectors.EVENT_READ, "events")
        selector.register(self.channel.fileno(), selectors.EVENT_READ, "channel")
        buffer = b""
        open_streams = 2
        while open_streams:
            for key, _ in selector.select():
                if key.data == "events":
                    data = os.read(event_fd, 65536)
                    if not data:
                        open_streams -= 1
                        selector.unregister(event_fd)
                        continue
                    buffer += data
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        self.on_event(json.loads(line))
                    continue
                messages = self.channel.read_nowait()
                if self.channel.closed:
                    open_streams -= 1
                    selector.unregister(self.channel.fileno())
                for message in messages:
                    self._on_message(message)
        selector.close()

    def _on_message(self, message: Message) -> None:
        op = message.get("op")
        if op == "ready":
            self.log.started = True
            self.on_ready(message)
        elif op == "exiting":
            self.on_refused(
                {"e": "refused", "error": message.get("code"), "why": message.get("message")}
            )
            return
        elif message.get("ok") is True and self.sent is not None:
            result = message.get("result")
            state = result.get("state", {}) if isinstance(result, dict) else {}
            if self.sent == _COMPACT:
                self.log.compacted = True
                self.log.ack("", int(state.get("epoch", 0)))
            else:
                self.log.ack(self.sent, int(state.get("epoch", 0)))
                self.pending.pop(0)
            self.tries = 0
        elif self.sent is not None and self.resend:
            error = message.get("error")
            code = error.get("code") if isinstance(error, dict) else error
            self.log.refused_retries.append(f"{self.sent} ({code})")
            self.pending.pop(0)
        elif self.sent is not None:
            self.tries += 1
            if self.tries > 1:  # the retry failed too: the worker exits or is broken
                self.sent = None
                self._send({"id": 0, "op": "stop"})
                return
        compact = self.scenario.compact
        if (
            compact is not None
            and not self.resend
            and compact[0] in self.log.acked
            and not self.log.compacted
        ):
            # The operator's compaction, once its request is acknowledged; not repeated
            # after a crash once acknowledged (in flight, it may be: operators retry).
            self.sent = _COMPACT
            self._send({"id": 0, "op": "compact", "summary": compact[1]})
            return
        if self.pending:
            key, text = self.pending[0]
            self.log.start(key)
            self.sent = key
            self._send({"id": len(self.pending), "op": "request",
                        "request": {"text": text, "key": key}})  # fmt: skip
            return
        self.sent = None
        self._send({"id": 0, "op": "stop"})

    def _send(self, message: Message) -> None:
        try:
            self.channel.send(message)
        except OSError:
            return  # the worker died; its end of stream ends the loop
