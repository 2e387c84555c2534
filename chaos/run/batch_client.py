"""The rig as a pipelining client: batches of requests on a connection of its own.

A scenario with ``batches`` is driven as a user's program drives ``Client.send_many``
or ``Client.stream``: once the worker is ready, the rig hands it a connection as the
daemon does (``attach``, the descriptor by SCM_RIGHTS) and writes each batch's
requests on it in one write, so that the worker reads them together and applies them
as one batch (a key may be in it twice). With ``stream`` each request asks for
partials, which only a client's own connection gets. Requests refused by the worker
are sent again alone, once each, as a user resends by key; after a death the next
worker gets what got no answer. ``chaos.oracle.batch_checks`` judges each answer as it comes.
"""

from __future__ import annotations

import json
import os
import select
import selectors
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from chaos.oracle.batch_checks import (
    REPEATED,
    STREAM,
    Attempt,
    judge_batch,
    judge_partial,
    judge_stream,
)
from chaos.oracle.oracle import ClientLog
from chaos.scenarios.scenarios import Scenario
from worker.ipc.wire import Channel, FrameReader, Message, WireError, encode


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


@dataclass(slots=True)
class BatchClient:
    """Sends the scenario's batches in order, each in one write on a direct connection."""

    scenario: Scenario
    log: ClientLog
    channel: Channel
    on_event: Callable[[dict[str, object]], None]
    on_ready: Callable[[Message], None]
    on_refused: Callable[[dict[str, object]], None]
    on_error: Callable[[str, object], None] | None = None
    direct: socket.socket | None = None
    reader: FrameReader = field(default_factory=FrameReader)
    waiting: dict[int, Attempt] = field(default_factory=dict)  # request id -> attempt
    batch: list[Attempt] = field(default_factory=list)  # the attempts of the batch out
    todo: list[list[str]] = field(default_factory=list)  # the batches still to send
    retries: list[str] = field(default_factory=list)  # refused keys, to send alone
    retried: set[str] = field(default_factory=set)
    next_id: int = 1
    done: dict[int, Attempt] = field(default_factory=dict)  # answered, for late partials

    def run(self, event_fd: int) -> None:
        """Serve until the trace, the control channel and the connection all end."""
        # A client never sends again what it was told is done: only what got no answer.
        self.todo = [[k for k in keys if k not in self.log.acked] for keys in self.scenario.batches]
        self.todo = [keys for keys in self.todo if keys]
        if self.scenario.stream:
            self.log.checks.add(STREAM)
        if any(len(set(keys)) < len(keys) for keys in self.scenario.batches):
            self.log.checks.add(REPEATED)
        selector = selectors.DefaultSelector()
        selector.register(event_fd, selectors.EVENT_READ, "events")
        selector.register(self.channel.fileno(), selectors.EVENT_READ, "control")
        buffer = b""
        events_open = True

        def read_events() -> None:
            nonlocal buffer, events_open
            data = os.read(event_fd, 65536)
            if not data:
                events_open = False
                selector.unregister(event_fd)
                return
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                self.on_event(json.loads(line))

        while selector.get_map():
            for key, _ in selector.select():
                if key.data == "events":
                    if events_open and _readable(event_fd):
                        read_events()
                    continue
                # What the worker traced before this frame is read first (as the
                # requests client does), so a reply is judged after what preceded it.
                while events_open and _readable(event_fd):
                    read_events()
                if key.data == "control":
                    for message in self.channel.read_nowait():
                        self._on_control(message, selector)
                    if self.channel.closed:
                        selector.unregister(self.channel.fileno())
                elif not self._read_direct():
                    selector.unregister(key.fileobj)
                    self._died()
        selector.close()
        if self.direct is not None:
            self.direct.close()

    def _on_control(self, message: Message, selector: selectors.BaseSelector) -> None:
        op = message.get("op")
        if op == "ready":
            self.log.started = True
            self.on_ready(message)
            self.direct = self._attach()
            if self.direct is None:
                return
            selector.register(self.direct, selectors.EVENT_READ, "direct")
            self._next()
        elif op == "exiting":
            self.on_refused(
                {"e": "refused", "error": message.get("code"), "why": message.get("message")}
            )

    def _attach(self) -> socket.socket | None:
        """A connection of our own to the worker, handed over as the daemon does."""
        ours, theirs = socket.socketpair()
        try:
            socket.send_fds(self.channel.sock, [encode({"op": "attach"})], [theirs.fileno()])
        except OSError:
            ours.close()
            return None  # the worker died; its end of stream ends the run
        finally:
            theirs.close()
        return ours

    def _read_direct(self) -> bool:
        """Take what the connection holds; False at its end."""
        assert self.direct is not None
        try:
            data = self.direct.recv(1 << 18)
        except ConnectionResetError:
            data = b""
        if not data:
            return False
        try:
            messages = self.reader.feed(data)
        except WireError as exc:
            self.log.problem(STREAM, f"the worker sent a frame that does not decode: {exc}")
            return False
        for message in messages:
            self._on_frame(message)
        return True

    def _on_frame(self, message: Message) -> None:
        request_id = message.get("id")
        attempt = self.waiting.get(request_id) if type(request_id) is int else None
        partial = message.get("partial")
        if isinstance(partial, str):
            if attempt is None:
                late = self.done.get(request_id) if type(request_id) is int else None
                judge_partial(self.log, late, request_id)
                return
            if not self.scenario.stream:
                self.log.problem(STREAM, f"a partial came for {attempt.key!r}, never asked")
            attempt.partials.append(partial)
            return
        if attempt is None or type(request_id) is not int:
            return  # no request of ours: a bad_request about a frame (not sent)
        del self.waiting[request_id]
        self.done[request_id] = attempt
        attempt.answered = True
        result = message.get("result")
        if message.get("ok") is True and isinstance(result, dict):
            attempt.result = result
            state = result.get("state", {})
            self.log.ack(attempt.key, int(state.get("epoch", 0)) if isinstance(state, dict) else 0)
        else:
            error = message.get("error")
            attempt.code = error.get("code") if isinstance(error, dict) else error
        if self.scenario.stream:
            judge_stream(self.log, attempt)
        if not self.waiting:
            self._batch_answered()

    def _batch_answered(self) -> None:
        """Every request of the batch is answered: judge it, then send what comes next."""
        applied = {a.key for a in self.batch if a.result is not None}
        for attempt in self.batch:
            if attempt.result is not None or attempt.key in applied:
                continue  # a key refused once, then applied by the same batch, is applied
            applied.add(attempt.key)
            if self.on_error is not None:
                self.on_error(attempt.key, attempt.code)  # not on disk, now
            if attempt.key in self.retried:
                self.todo.clear()  # its retry failed too: the worker exits or is broken
                self.retries.clear()
            else:
                self.retries.append(attempt.key)
        if self.scenario.stream:
            for attempt in self.batch:
                if attempt.result is not None:
                    self.log.answers.setdefault(attempt.key, attempt.result)
        else:
            judge_batch(self.log, self.batch)
        self._next()

    def _next(self) -> None:
        """Send the next retry alone, or the next batch, or stop the worker."""
        if self.retries:
            key = self.retries.pop(0)
            self.retried.add(key)
            self._send([key])
        elif self.todo:
            self._send(self.todo.pop(0))
        else:
            try:
                self.channel.send({"id": 0, "op": "stop"})
            except OSError:
                return  # the worker died; its end of stream ends the loop

    def _send(self, keys: list[str]) -> None:
        """The requests of ``keys``, in one write: the worker reads them as one batch."""
        assert self.direct is not None
        texts = dict(self.scenario.requests)
        frames = []
        self.batch = []
        for key in keys:
            attempt = Attempt(key=key, text=texts[key])
            request: Message = {"text": attempt.text, "key": key}
            if self.scenario.stream:
                request["stream"] = True
            self.waiting[self.next_id] = attempt
            self.batch.append(attempt)
            frames.append(encode({"id": self.next_id, "op": "request", "request": request}))
            self.next_id += 1
            self.log.start(key)
        try:
            self.direct.sendall(b"".join(frames), socket.MSG_NOSIGNAL)
        except OSError:
            return  # the worker died; its end of stream ends the loop

    def _died(self) -> None:
        """The connection ended with requests unanswered: their partials were cut short."""
        if self.scenario.stream:
            for attempt in self.waiting.values():
                judge_stream(self.log, attempt, died=True)
        self.waiting.clear()
