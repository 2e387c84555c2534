"""``Client``: a home's traffic, straight to the sessions' workers.

``Client(home)`` keeps one connection to the daemon for control and, per session, a
direct connection to the session's worker that the daemon hands over (SCM_RIGHTS):
requests then cost two process wake-ups (client, worker) and never pass through the
daemon's loop. Every request carries a key (one is made up when the caller gives none),
so after a worker's death (an end of stream) the client reconnects through the daemon
and sends what was unanswered again: what was applied is answered from the log. A key
is applied once for the life of the session, whichever client or process sends it and
however many epochs have passed (docs/format.md, "The key index"): a request whose
outcome is unknown may always be sent again with its key.

Before sending anything, both check that the socket file and the process behind it
belong to the caller's own uid: another user cannot stand in for the daemon.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from supervisor.client.control import READ_SIZE, RETRYABLE, call, exchange, result_of
from supervisor.client.handoff import handed_link
from supervisor.client.outcomes import outcome_of as _outcome
from supervisor.client.outcomes import result_or_raise as _result_or_raise
from supervisor.client.outcomes import take_replies as _take
from supervisor.client.outcomes import unanswered as _unanswered
from supervisor.client.streaming import Stream
from supervisor.errors import ControlError
from worker.ipc.wire import FrameReader, Message, WireError, encode

__all__ = ["Client", "Request", "payload_of"]

_RETRY_PAUSE: Final = 0.02


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """One request for a session: its text, its key (made up if None), untrusted or not."""

    text: str
    key: str | None = None
    untrusted: bool = False


class Client:
    """A persistent client of one home; requests go straight to the sessions' workers."""

    def __init__(
        self, home: str, *, timeout: float = 60.0, retry_for: float = 30.0,
        tenant: str | None = None,
    ) -> None:  # fmt: skip
        self.home = home
        self.tenant = tenant  # asked as this tenant: its own sessions only (the HTTP port)
        self.timeout = timeout
        self.retry_for = retry_for
        self._links: dict[str, socket.socket] = {}
        # One reply reader per connection, kept between calls (a new one costs a msgpack
        # Unpacker per request); empty after each reply, as a fresh one would be.
        self._readers: dict[str, FrameReader] = {}
        self._ids = itertools.count(1)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every connection."""
        for sock in self._links.values():
            sock.close()
        self._links.clear()
        self._readers.clear()

    def call(self, op: str, **fields: object) -> object:
        """One control request to the daemon (status, create, stop, ...)."""
        return call(self.home, op, timeout=self.timeout, **{"tenant": self.tenant, **fields})

    def send(
        self, session: str, text: str, *, key: str | None = None, untrusted: bool = False
    ) -> Message:
        """Apply one request to ``session`` and return its result (retried by key)."""
        sock = self._links.get(session)
        request = Request(text=text, key=key or _made_up_key(), untrusted=untrusted)
        if sock is None:
            return _result_or_raise(self.send_many(session, [request])[0])
        # The common case, kept short: a live connection, one frame out, one frame back,
        # on a blocking socket whose kernel timeouts (SO_RCVTIMEO) spare a poll per call.
        payload = payload_of(request)
        request_id = next(self._ids)
        frame = encode({"id": request_id, "op": "request", "request": payload})
        try:
            reply = _round_trip(sock, frame, self._reader(session))
        except BlockingIOError as exc:  # SO_RCVTIMEO or SO_SNDTIMEO ran out
            self._drop(session)
            raise ControlError(
                "timeout", f"session {session} did not answer within {self.timeout:g} s"
            ) from exc
        except OSError:
            # The worker died (end of stream): the general path reconnects and sends the
            # same frame (the same key) again.
            self._drop(session)
            return _result_or_raise(self._send_payloads(session, [payload])[0])
        if reply.get("id") != request_id:
            self._drop(session)
            raise ControlError("bad_reply", f"a reply to another request: {reply!r}")
        result = result_of(reply)
        return result if isinstance(result, dict) else {"result": result}

    def stream(
        self, session: str, text: str, *, key: str | None = None, untrusted: bool = False
    ) -> Stream:
        """Send one request whose App streams: iterate for its partial texts as they come,
        then read ``.reply`` (retried by key after a worker's death; partials start again).
        """
        self._link(session, time.monotonic() + self.retry_for)
        request = Request(text=text, key=key or _made_up_key(), untrusted=untrusted)
        return Stream(self, session, payload_of(request))

    def schedule(
        self,
        session: str,
        at: str,
        text: str,
        *,
        key: str | None = None,
        untrusted: bool = False,
    ) -> Message:
        """Schedule request ``text`` for ``session``, delivered once at or after ``at``.

        ``at``: ISO 8601 with a zone. The schedule is keyed (one is made up when None):
        the same key again is answered ``"duplicate": true``; a key a request already
        used is refused. Returns ``{"key", "at", "duplicate"}`` (docs/operations.md).
        """
        spec: Message = {"at": at, "text": text, "untrusted": untrusted}
        payload: Message = {"key": _made_up_key() if key is None else key, "schedule": spec}
        self._link(session, time.monotonic() + self.retry_for)
        return _result_or_raise(self._send_payloads(session, [payload])[0])

    def cancel_schedule(self, session: str, key: str) -> Message:
        """Cancel ``session``'s pending schedule ``key``: ``{"cancelled": bool, "key", ...}``.

        Not pending (delivered, cancelled before, never scheduled) is ``"cancelled":
        false`` with ``"why"``; a cancel may be sent again freely.
        """
        payload: Message = {"key": _made_up_key(), "unschedule": key}
        self._link(session, time.monotonic() + self.retry_for)
        return _result_or_raise(self._send_payloads(session, [payload])[0])

    def records(self, session: str, *, since: int = 0, epoch: int | None = None) -> Message:
        """A page of the current epoch's records, from the worker's memory.

        ``since``: lines of the epoch already seen (0: from its SessionStart); ``epoch``:
        the epoch they belong to (None: the current one; an older one is read from its
        sealed log). The result holds ``epoch``, ``current`` (the newest epoch),
        ``records`` (their JSON objects), ``next`` (the ``since`` of the next page) and
        ``lines`` (the epoch's length).
        """
        deadline = time.monotonic() + self.retry_for
        message: Message = {"op": "records", "since": since}
        if epoch is not None:
            message["epoch"] = epoch
        while True:
            sock = self._link(session, deadline)
            try:
                frame = encode({"id": next(self._ids), **message})
                reply = _round_trip(sock, frame, self._reader(session))
            except BlockingIOError as exc:
                self._drop(session)
                raise ControlError(
                    "timeout", f"session {session} did not answer within {self.timeout:g} s"
                ) from exc
            except OSError as exc:
                self._drop(session)
                if time.monotonic() > deadline:
                    raise ControlError(
                        "worker_died", f"the worker of session {session} kept dying: {exc}"
                    ) from exc
                continue
            result = result_of(reply)
            if not isinstance(result, dict):
                raise ControlError("bad_reply", f"records: {result!r}")
            return result

    # -- what a Stream uses (streaming.Connections) ---------------------------------------

    def link(self, session: str, deadline: float) -> socket.socket:
        return self._link(session, deadline)

    def drop(self, session: str) -> None:
        self._drop(session)

    def next_id(self) -> int:
        return next(self._ids)

    def send_many(self, session: str, requests: Sequence[Request]) -> list[Message]:
        """Pipeline requests to ``session``; return each one's own outcome, in order.

        Requests sent together share the worker's group commits. After a worker's death
        the unanswered ones are sent again with their keys until ``retry_for`` passes.
        One request's failure never hides another's outcome; each is a dict with its
        ``"key"`` (the caller's, or the one made up for it) and ``"outcome"``:

        - ``"applied"``: applied now; the rest is the worker's result (``epoch``,
          ``call``, ``text``, ``committed``, ...).
        - ``"duplicate"``: the key was applied before (by this call's earlier try, or
          any client, in any epoch); nothing was applied again; the result says where
          (``epoch``, ``line``).
        - ``"refused"``: the worker answered with an error, ``"error": {"code",
          "message"}``; not applied.
        - ``"unanswered"``: no answer came (``"error"`` says why: a timeout, a worker
          that kept dying, a session that went away), or a cluster worker answered
          ``not_owner`` after the request's group commit (its lease lapsed between the
          fsync and the reply); it may or may not be applied. A ``not_owner`` that the
          worker checked before writing (``"before_write": true``) is ``"refused"``.

        A refused or unanswered request may be sent again with the same key: it is
        applied at most once. Raises ControlError only if the session cannot be
        reached before anything is sent (then nothing was applied).
        """
        self._link(session, time.monotonic() + self.retry_for)
        return self._send_payloads(session, [payload_of(r) for r in requests])

    def _send_payloads(self, session: str, payloads: list[Message]) -> list[Message]:
        deadline = time.monotonic() + self.retry_for
        frames: dict[int, bytes] = {}
        keys: dict[int, object] = {}
        for payload in payloads:
            request_id = next(self._ids)
            frames[request_id] = encode({"id": request_id, "op": "request", "request": payload})
            keys[request_id] = payload["key"]
        answers: dict[int, Message] = {}
        while len(answers) < len(frames):
            failure = self._exchange_rest(session, frames, answers, deadline)
            if failure is not None:
                return [
                    _outcome(answers[i], keys[i]) if i in answers else _unanswered(failure, keys[i])
                    for i in frames
                ]
        return [_outcome(answers[i], keys[i]) for i in frames]

    def _exchange_rest(
        self, session: str, frames: dict[int, bytes], answers: dict[int, Message], deadline: float
    ) -> ControlError | None:
        """Send the unanswered frames once and take what comes back; why it stopped, if it did."""
        try:
            sock = self._link(session, deadline)
        except ControlError as exc:
            return exc  # the session went away: what was not answered stays unknown
        waiting = [i for i in frames if i not in answers]
        replies: list[Message] = []  # filled as they come: kept if the worker dies next
        try:
            _replies, fds = exchange(
                sock, b"".join(frames[i] for i in waiting), len(waiting),
                max(deadline, time.monotonic() + self.timeout), replies,
            )  # fmt: skip
        except (TimeoutError, ControlError, OSError) as exc:
            _take(replies, frames, answers)  # what was answered before the failure stays so
            return self._failed(session, exc, deadline)
        for fd in fds:
            os.close(fd)
        _take(replies, frames, answers)
        return None

    def _failed(
        self, session: str, exc: TimeoutError | ControlError | OSError, deadline: float
    ) -> ControlError | None:
        """Why an exchange stopped, or None to send the rest again on a new connection."""
        self._drop(session)
        if isinstance(exc, TimeoutError):
            return ControlError(
                "timeout", f"session {session} did not answer within {self.timeout:g} s"
            )
        if isinstance(exc, ControlError):  # a reply that does not decode
            return exc
        # The worker died (end of stream): reconnect and send the rest again.
        if time.monotonic() > deadline:
            return ControlError("worker_died", f"the worker of session {session} kept dying: {exc}")
        return None

    def _link(self, session: str, deadline: float) -> socket.socket:
        """The direct connection to ``session``'s worker, asked of the daemon if needed."""
        sock = self._links.get(session)
        if sock is None:
            sock = self._links[session] = self.connect(session, deadline)
            self._readers.pop(session, None)  # a new connection starts with a new reader
        return sock

    def connect(self, session: str, deadline: float) -> socket.socket:
        """A new direct connection to ``session``'s worker, the caller's to own and close:
        asked of the daemon again while the session restarts, until ``deadline``."""
        while True:
            try:
                return self._connect(session)
            except ControlError as exc:
                if exc.code not in RETRYABLE or time.monotonic() > deadline:
                    raise
                time.sleep(_RETRY_PAUSE)  # the worker restarts; the daemon queues us

    def _connect(self, session: str) -> socket.socket:
        return handed_link(self.home, session, self.tenant, self.timeout)

    def _reader(self, session: str) -> FrameReader:
        reader = self._readers.get(session)
        if reader is None:
            reader = self._readers[session] = FrameReader()
        return reader

    def _drop(self, session: str) -> None:
        self._readers.pop(session, None)
        sock = self._links.pop(session, None)
        if sock is not None:
            sock.close()


def _round_trip(sock: socket.socket, frame: bytes, reader: FrameReader) -> Message:
    """Send one frame and read one reply on a blocking socket; ConnectionError at its end.

    ``reader`` is the connection's, holding nothing between calls: whatever came in
    after the reply, or before a bad frame, is dropped with it (each call starts clean).
    """
    if sock.gettimeout() is not None:
        sock.settimeout(None)  # back to blocking after a pipeline's selector exchange
    sock.sendall(frame)
    if reader.buffered:
        reader.reset()
    while True:
        data = sock.recv(READ_SIZE)
        if not data:
            raise ConnectionResetError("end of stream")
        try:
            replies = reader.feed(data)
        except WireError as exc:
            reader.reset()
            raise ControlError("bad_reply", str(exc)) from exc
        if replies:
            if len(replies) > 1 or reader.buffered:
                reader.reset()
            return replies[0]


def _made_up_key() -> str:
    return f"auto-{uuid.uuid4().hex}"


def payload_of(request: Request) -> Message:
    """The ``request`` field of a request's frame (its key made up if it has none)."""
    payload: Message = {"text": request.text, "key": request.key or _made_up_key()}
    if request.untrusted:
        payload["untrusted"] = True
    return payload
