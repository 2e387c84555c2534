"""The rig as the client of a real worker: requests in order, replies as acknowledgements."""

from __future__ import annotations

import json
import os
import select
import selectors
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from chaos.oracle.oracle import ClientLog
from chaos.run.batch_client import BatchClient
from chaos.scenarios.scenarios import Scenario
from worker.ipc.wire import Channel, Message

_COMPACT: Final = "\0compact"  # what ``sent`` holds while the operator's compact is out


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


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
    on_error: Callable[[str, object], None] | None = None  # an error reply: (key, code)
    # Each message, before it is sent: the rig's effects service learns the request in
    # flight (chaos.run.effects_service).
    on_send: Callable[[Message], None] | None = None
    pending: list[tuple[str, str]] = field(default_factory=list)
    sent: str | None = None
    tries: int = 0
    lapsed: bool = False  # the cluster node's lease lapsed (the fault ``lease``)

    def run(self, event_fd: int) -> None:
        """Serve until both the trace and the channel reach their end."""
        if self.scenario.batches:  # pipelined batches on a connection of its own
            BatchClient(
                scenario=self.scenario,
                log=self.log,
                channel=self.channel,
                on_event=self.on_event,
                on_ready=self.on_ready,
                on_refused=self.on_refused,
                on_error=self.on_error,
            ).run(event_fd)
            return
        # A client never sends again what it was told is done: only what got no answer.
        self.pending = [
            r for r in self.scenario.requests if self.resend or r[0] not in self.log.acked
        ]
        selector = selectors.DefaultSelector()
        selector.register(event_fd, selectors.EVENT_READ, "events")
        selector.register(self.channel.fileno(), selectors.EVENT_READ, "channel")
        buffer = b""
        open_streams = 2
        events_open = True

        def read_events() -> None:
            nonlocal buffer, open_streams, events_open
            data = os.read(event_fd, 65536)
            if not data:
                open_streams -= 1
                events_open = False
                selector.unregister(event_fd)
                return
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                event = json.loads(line)
                if event.get("e") == "lease_lapsed":
                    self.lapsed = True
                self.on_event(event)

        while open_streams:
            for key, _ in selector.select():
                if key.data == "events":
                    # Ready when the select began; the channel's turn may have drained it.
                    if events_open and _readable(event_fd):
                        read_events()
                    continue
                # What the worker traced before this reply is in the pipe already: read
                # it first, so that a reply is judged after the events that preceded it.
                while events_open and _readable(event_fd):
                    read_events()
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
        elif op == "state":
            return  # a report for the supervisor (its state, an App's version changed)
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
                if self.lapsed:
                    self.log.problem(
                        "no-ack-without-lease",
                        f"request {self.sent!r} was acknowledged after the node's lease lapsed",
                    )
                if isinstance(result, dict):
                    self.log.answers.setdefault(self.sent, result)
                self.log.ack(self.sent, int(state.get("epoch", 0)))
                self.pending.pop(0)
            self.tries = 0
        elif self.sent is not None and self.resend:
            error = message.get("error")
            code = error.get("code") if isinstance(error, dict) else error
            self._error_reply(code)
            self.log.refused_retries.append(f"{self.sent} ({code})")
            self.pending.pop(0)
        elif self.sent is not None:
            error = message.get("error")
            if message.get("ok") is False:
                self._error_reply(error.get("code") if isinstance(error, dict) else error)
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

    def _error_reply(self, code: object) -> None:
        if self.on_error is not None and self.sent is not None and self.sent != _COMPACT:
            self.on_error(self.sent, code)

    def _send(self, message: Message) -> None:
        if self.on_send is not None:
            self.on_send(message)
        try:
            self.channel.send(message)
        except OSError:
            return  # the worker died; its end of stream ends the loop
