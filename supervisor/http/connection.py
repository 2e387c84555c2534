"""One connection of the HTTP port, read by the loop as its bytes arrive (a Protocol).

Requests are read in ``data_received`` (heads by ``parser.parse_head``, as strict as RFC
9112 asks) and answered one at a time, in order; what comes meanwhile waits (reading
pauses past ``BUFFERED_WHILE_BUSY``, and in every phase while the transport's writing
is paused: ``_flow``). A send on a kept worker connection is answered by callbacks
(``Api.answer_nowait``), any other request by a task (``Api.answer``). Every error on a
request's path ends in one answer, an HttpError's own or a 500 ``internal`` and the
connection closed (``_failed``); none leaves a callback (a pipelined request is read in
the callback of the worker connection that answered the one before).

Deadlines: ``KEEP_ALIVE_IDLE`` for a request's first byte (then closed without a word),
``HEADER_DEADLINE`` to the end of its head, ``BODY_DEADLINE`` to the end of its body
(then answered 408 and closed), none while a request is answered; the idle one only
while nothing received is unanswered and writing is not paused. One timer keeps them
(a deadline moved later is only noted; the timer, fired early, is armed again). Bytes
the peer takes none of for ``WRITE_STALL`` s (writing paused, or after a close) abort
the connection."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

from supervisor.http.limits import (
    BUFFERED_WHILE_BUSY,
    INTERNAL,
    LINGER,
    LINGER_BYTES,
    MAX_CONNECTIONS,
    MAX_REQUESTS_PER_CONNECTION,
    WRITE_STALL,
)
from supervisor.http.parser import (
    BODY_DEADLINE,
    HEADER_DEADLINE,
    KEEP_ALIVE_IDLE,
    MAX_HEAD,
    HttpError,
    HttpRequest,
    body_length,
    parse_head,
)
from supervisor.http.phases import READING as _READING
from supervisor.http.phases import Phase
from supervisor.http.responses import error_response
from supervisor.http.routes import Api

_END_OF_HEAD: Final = b"\r\n\r\n"
_CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"


class HttpConnection(asyncio.Protocol):
    """One client's connection: its requests read, answered in turn, kept alive within
    ``MAX_REQUESTS_PER_CONNECTION`` and the deadlines; also the ``Writer`` of their
    answers. ``open`` is the port's set of connections, this one in it while open."""

    def __init__(self, api: Api, open_connections: set[HttpConnection]) -> None:
        self._api = api
        self._open = open_connections
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._phase = Phase.IDLE
        self._buffer = bytearray()
        self._scanned = 0  # the buffer's bytes searched for the end of the head, less 3
        self._head: tuple[str, str, dict[str, str], int] | None = None
        self._served = 0
        self._began = False  # a byte of the current request's answer written
        self._eof = False
        self._reading_paused = False
        self._writing_paused = False
        self._drained: list[asyncio.Future[None]] = []
        self._lingered = 0
        self._deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[bool] | None = None
        self._stall: asyncio.TimerHandle | None = None
        self._resumed = False  # writing resumed since the stall's last look

    # The transport's side.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._open.add(self)
        if len(self._open) > MAX_CONNECTIONS:
            self._refuse(HttpError(503, "busy", "too many connections"))
            return
        self._wait(KEEP_ALIVE_IDLE)

    def data_received(self, data: bytes) -> None:
        if self._phase is Phase.LINGER:
            self._discard(len(data))
            return
        self._buffer += data
        if self._phase is not Phase.BUSY:
            self._advance()
        if self._writing_paused or len(self._buffer) > BUFFERED_WHILE_BUSY:
            self._flow()

    def eof_received(self) -> bool:
        self._eof = True
        if self._phase is Phase.LINGER:
            self._close()
        elif self._phase is not Phase.BUSY:
            self._advance()
        return True  # the transport stays open for an answer: ours to close

    def connection_lost(self, exc: Exception | None) -> None:
        self._phase = Phase.CLOSED
        self._open.discard(self)
        for timer in (self._timer, self._stall):
            if timer is not None:
                timer.cancel()
        self._timer = self._stall = None
        self._wake_drained()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._flow()
        self._watch_stall()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._resumed = True
        self._wake_drained()
        if self._phase in _READING:
            self._advance()
        self._flow()

    # The answers' side (``responses.Writer``).

    def write(self, data: bytes) -> None:
        # An answer's bytes, while it is answered only: a refusal already written (after
        # an error) ends the connection, and nothing may follow it.
        if self._phase is Phase.BUSY and self._transport is not None:
            self._began = True
            self._transport.write(data)

    async def drain(self) -> None:
        if self._transport is not None and self._transport.is_closing():
            await asyncio.sleep(0)  # its connection_lost comes on the loop's next turn
        if self._phase is Phase.CLOSED:
            raise ConnectionResetError("Connection lost")
        if not self._writing_paused:
            return
        waiter = self._loop.create_future()
        self._drained.append(waiter)
        await waiter

    def abort(self) -> None:
        """End the connection now, its unsent bytes dropped (the port stops)."""
        if self._transport is not None:
            self._transport.abort()

    # Reading requests.

    def _advance(self) -> None:
        """Read what the buffer holds of the next request; answer it once whole. Never
        raises: it runs in the transport's callbacks and in a worker connection's."""
        try:
            self._advance_or_raise()
        except Exception as exc:  # noqa: BLE001 (a callback's boundary: answered, never raised)
            self._failed(exc)

    def _advance_or_raise(self) -> None:
        while self._phase in _READING and not self._writing_paused:
            if self._phase is Phase.IDLE:
                if not self._request_began():
                    if self._eof:
                        self._close()  # no request began: closed without a word
                    elif self._deadline is None:
                        self._wait(KEEP_ALIVE_IDLE)  # idle from now: all is answered
                    return
                self._phase = Phase.HEAD
                self._wait(HEADER_DEADLINE)
            if self._phase is Phase.HEAD and not self._read_head():
                return
            if self._head is not None:
                method, target, headers, length = self._head
                if len(self._buffer) < length:
                    if self._eof:
                        self._refuse(HttpError(400, "bad_request",
                                               "the connection ended inside a body"))  # fmt: skip
                    return
                body = bytes(self._buffer[:length])
                del self._buffer[:length]
                self._head = None
                if self._served + 1 >= MAX_REQUESTS_PER_CONNECTION:
                    headers["connection"] = "close"  # the last one: its answer says so
                request = HttpRequest(method=method, target=target, headers=headers, body=body)
                self._answer(request)

    def _read_head(self) -> bool:
        """Whether the head was read whole (the phase is BODY then); False if it is not
        here yet, or was refused."""
        end = self._buffer.find(_END_OF_HEAD, self._scanned)
        if end < 0:
            if len(self._buffer) >= MAX_HEAD:
                self._refuse(HttpError(431, "too_large", f"a request head over {MAX_HEAD} bytes"))
            elif self._eof:
                why = "the connection ended inside a request's head"
                self._refuse(HttpError(400, "bad_request", why))
            else:
                self._scanned = max(0, len(self._buffer) - 3)
            return False
        end += len(_END_OF_HEAD)
        head = bytes(self._buffer[:end])
        del self._buffer[:end]
        self._scanned = 0
        try:
            method, target, headers = parse_head(head)
            length = body_length(headers)
        except HttpError as exc:
            self._refuse(exc)
            return False
        expect = headers.get("expect")
        if expect is not None and expect.lower() != "100-continue":
            self._refuse(HttpError(417, "bad_request", f"the expectation {expect[:60]!r}"))
            return False
        if expect is not None and len(self._buffer) < length and self._transport is not None:
            self._transport.write(_CONTINUE)  # the client waits for it to send its body
        self._head = (method, target, headers, length)
        self._phase = Phase.BODY
        self._wait(BODY_DEADLINE)
        return True

    def _request_began(self) -> bool:
        """Whether the buffer holds a request's first byte: empty lines (CRLF) before a
        request line are dropped, as RFC 9112 2.2 asks of a server (a lone CR waits for
        its LF)."""
        buffer, empty = self._buffer, 0
        while buffer.startswith(b"\r\n", empty):
            empty += 2
        del buffer[:empty]
        return bool(buffer) and buffer != b"\r"

    # Answering.

    def _answer(self, request: HttpRequest) -> None:
        self._phase = Phase.BUSY
        self._deadline = None  # the answer's deadlines are its calls' own
        self._began = False
        self._served += 1
        if self._api.answer_nowait(request, self, self._answered):
            return
        self._task = self._loop.create_task(self._api.answer(request, self))
        self._task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[bool]) -> None:
        self._task = None
        if task.cancelled():
            self.abort()
            return
        failure = task.exception()
        if failure is None:
            self._answered(task.result())
        elif isinstance(failure, Exception):
            self._failed(failure)
        else:
            self.abort()

    def _answered(self, keep: bool) -> None:
        """The answer is written: the next request, or the end of the connection."""
        if self._phase is not Phase.BUSY:
            return  # closed meanwhile
        if not keep or self._served >= MAX_REQUESTS_PER_CONNECTION:
            self._close()
            return
        self._phase = Phase.IDLE
        self._advance()  # the next request, or the idle deadline if none is here
        if self._reading_paused or len(self._buffer) > BUFFERED_WHILE_BUSY:
            self._flow()

    def _failed(self, exc: Exception) -> None:
        """An error on a request's path that is not an HttpError: logged, and answered
        500 unless its answer began (then the connection is ended at once)."""
        gone = self._transport is None or self._transport.is_closing()
        if not isinstance(exc, ConnectionError) or not gone:  # not the peer's leaving
            self._loop.call_exception_handler(
                {"message": "an HTTP request failed", "exception": exc, "protocol": self}
            )
        unanswered = self._phase in _READING or (self._phase is Phase.BUSY and not self._began)
        if unanswered and not gone:
            self._refuse(INTERNAL)
            return
        if self._phase is not Phase.LINGER:
            self.abort()

    # Deadlines, refusals, the end.

    def _wait(self, seconds: float) -> None:
        """Let the current phase last ``seconds`` from now."""
        deadline = self._loop.time() + seconds
        self._deadline = deadline
        if self._timer is None or self._timer.when() > deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline is None or self._phase is Phase.CLOSED:
            return
        if deadline > self._loop.time():  # moved later since: armed again for it
            self._timer = self._loop.call_at(deadline, self._on_timer)
            return
        self._deadline = None
        if self._phase is Phase.IDLE:
            if not self._request_began():  # no request began: closed without a word
                self._close()
        elif self._phase is Phase.HEAD:
            why = f"no whole request head within {HEADER_DEADLINE:g} s"
            self._refuse(HttpError(408, "timeout", why))
        elif self._phase is Phase.BODY:
            length = self._head[3] if self._head is not None else 0
            why = f"no whole body of {length} bytes within {BODY_DEADLINE:g} s of its head"
            self._refuse(HttpError(408, "timeout", why))
        elif self._phase is Phase.LINGER:
            self.abort()

    def _refuse(self, exc: HttpError) -> None:
        """Answer ``exc`` and close: our side ended at once, the peer's rest read (at most
        ``LINGER_BYTES``, for ``LINGER`` s) so that closing resets nothing unread."""
        assert self._transport is not None
        self._transport.write(error_response(exc.status, exc.code, exc.message,
                                             keep_alive=False))  # fmt: skip
        self._phase = Phase.LINGER
        self._head = None
        if self._eof:
            self._close()
            return
        if self._transport.can_write_eof():
            self._transport.write_eof()
        self._flow()  # read again, to discard
        self._wait(LINGER)
        unread, self._buffer = len(self._buffer), bytearray()
        self._discard(unread)

    def _discard(self, count: int) -> None:
        self._lingered += count
        if self._lingered >= LINGER_BYTES:
            self.abort()

    def _flow(self) -> None:
        """Pause reading while what is read could not be taken, resume it otherwise: not
        while the transport's writing is paused (in every phase but a refusal's, which
        reads to discard), nor past ``BUFFERED_WHILE_BUSY`` while a request is answered."""
        phase = self._phase
        pause = phase is not Phase.LINGER and (
            self._writing_paused
            or (phase is Phase.BUSY and len(self._buffer) > BUFFERED_WHILE_BUSY)
        )
        if pause is self._reading_paused or self._transport is None or phase is Phase.CLOSED:
            return
        self._reading_paused = pause
        with contextlib.suppress(RuntimeError):  # already closing
            if pause:
                self._transport.pause_reading()
            else:
                self._transport.resume_reading()

    def _close(self) -> None:
        """End the connection once what was written is sent (``_watch_stall``)."""
        self._phase = Phase.CLOSED
        if self._transport is not None:
            self._transport.close()
            self._watch_stall()

    def _watch_stall(self) -> None:
        """While writing is paused or a close waits for unsent bytes: aborted if the peer
        takes none of them for ``WRITE_STALL`` s (the transport would wait for good)."""
        if self._stall is None and self._transport is not None:
            unsent = self._transport.get_write_buffer_size()
            self._resumed = False
            self._stall = self._loop.call_later(WRITE_STALL, self._stalled, unsent)

    def _stalled(self, unsent_before: int) -> None:
        self._stall = None  # connection_lost cancels it: the transport is still open here
        assert self._transport is not None
        unsent = self._transport.get_write_buffer_size()
        waiting = unsent and (self._writing_paused or self._phase is Phase.CLOSED)
        if not waiting:
            return
        if self._resumed or unsent < unsent_before:
            self._watch_stall()  # the peer took some: another WRITE_STALL from now
        else:
            self.abort()

    def _wake_drained(self) -> None:
        waiters, self._drained = self._drained, []
        for waiter in waiters:
            if waiter.done():
                continue
            if self._phase is Phase.CLOSED:
                waiter.set_exception(ConnectionResetError("Connection lost"))
            else:
                waiter.set_result(None)
