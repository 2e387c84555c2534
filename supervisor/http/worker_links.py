"""Sends answered on the port's own loop, over direct connections to the workers kept open.

An HTTP send used to be ``Client.send`` run on a pool thread: two thread hops a request,
each a wake-up waiting for a core and for the GIL (issue 34). Here the loop writes the
request's frame to the session's worker itself and reads the reply, the frames and the
result of ``Client.send``'s own path (``supervisor/client/direct.py``). A connection is
asked of the daemon on a pool thread (``Client.connect``: once a connection, and it may
wait while the session restarts), then kept: the requests on it are told apart by their
ids, and those in flight together share the worker's group commit. Each (tenant,
session) has a connection of its own: one tenant's connection never carries another's
request.

A worker that dies ends its connections (end of stream): the connection is closed and
forgotten at once, and every request it had in flight is handed to ``Client.send`` on
a pool thread with its key, which reconnects and sends it again exactly as a direct
client does: what was applied before the death is answered from the log. At most
``MAX_LINKS`` connections are kept with nothing in flight; past it the one used least
recently is closed.

A send on a connection already kept is answered without a task (``send_nowait``): the
reply's frame calls back the HTTP connection that wrote the request, from the link's
``data_received``, in the same turn of the loop (issue 34: a task woken by a future
took one more turn of the loop, a wait on epoll and a few hundred calls a send).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

from supervisor.client.control import result_of
from supervisor.client.direct import Request, payload_of
from supervisor.errors import ControlError
from supervisor.http.calls import MAX_IN_FLIGHT, RETRY_FOR, ClientPool
from worker.ipc.wire import FrameReader, Message, WireError, encode

MAX_LINKS: Final = 256
"""Connections to workers kept open with no request in flight (those in flight are
bounded by ``calls.MAX_IN_FLIGHT``)."""
REPLY_TIMEOUT: Final = 60.0
"""Seconds a worker has to answer a request: ``Client``'s timeout."""

_Key = tuple[str | None, str]  # (tenant, session)
Outcome = Message | BaseException
"""A request's reply frame, or why it has none (LinkLost, ControlError)."""
Done = Callable[[Outcome], None]
"""Called once with a request's outcome, on the loop; it must not raise."""


class LinkLost(Exception):
    """The connection ended before the request's reply: the worker died or was replaced."""


class WorkerLink(asyncio.Protocol):
    """One direct connection to a session's worker, read by the loop; replies by id."""

    def __init__(self, links: WorkerLinks, key: _Key) -> None:
        self.key = key
        self.waiting: dict[int, tuple[float, Done]] = {}  # by id: (deadline, done)
        self.lost = False
        self._links = links
        self._transport: asyncio.Transport | None = None
        self._reader = FrameReader()
        self._ids = itertools.count(1)
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            replies = self._reader.feed(data)
        except WireError as exc:
            self._fail(ControlError("bad_reply", str(exc)))
            self.close()
            return
        for reply in replies:
            request_id = reply.get("id")
            waiting = self.waiting.pop(request_id, None) if type(request_id) is int else None
            if waiting is not None:
                waiting[1](reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._links.forget(self)
        self._fail(LinkLost())

    def request(self, payload: Message, done: Done) -> int:
        """Write one request's frame; its id. ``done`` is called with its reply, LinkLost
        if the connection ends first, ControlError ``timeout`` past ``REPLY_TIMEOUT``.
        LinkLost or ControlError ``too_large`` past the frame limit: nothing sent,
        ``done`` never called."""
        if self.lost or self._transport is None:
            raise LinkLost
        request_id = next(self._ids)
        try:
            frame = encode({"id": request_id, "op": "request", "request": payload})
        except WireError as exc:
            raise ControlError("too_large", str(exc)) from exc
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REPLY_TIMEOUT
        self.waiting[request_id] = (deadline, done)
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._expire)
        self._transport.write(frame)
        return request_id

    def abandon(self, request_id: int) -> None:
        """Stop waiting for the request's reply (it timed out or was cancelled)."""
        self.waiting.pop(request_id, None)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.abort()  # connection_lost follows, on the loop

    def _expire(self) -> None:
        """Answer ``timeout`` to the requests past their deadline, the oldest first; arm
        the timer again for the next. One timer a connection, not one a request: the
        deadlines come in the order of the requests (each ``REPLY_TIMEOUT`` after it)."""
        self._timer = None
        now = asyncio.get_running_loop().time()
        for request_id, (deadline, done) in list(self.waiting.items()):
            if deadline > now:
                self._timer = asyncio.get_running_loop().call_at(deadline, self._expire)
                return
            del self.waiting[request_id]
            done(ControlError("timeout", f"session {self.key[1]} did not answer within "
                              f"{REPLY_TIMEOUT:g} s"))  # fmt: skip

    def _fail(self, exc: Exception) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiting, self.waiting = self.waiting, {}
        for _deadline, done in waiting.values():
            done(exc)


class WorkerLinks:
    """The port's connections to workers, by (tenant, session); ``send`` on the loop."""

    def __init__(self, pool: ClientPool) -> None:
        self.pool = pool
        self._links: OrderedDict[_Key, WorkerLink] = OrderedDict()
        self._opening: dict[_Key, asyncio.Task[WorkerLink]] = {}
        self._closed = False

    async def send(
        self, session: str, text: str, *, key: str, untrusted: bool, tenant: str | None
    ) -> Message:
        """``Client.send``'s answer: the worker's result, or its ControlError raised."""
        payload = payload_of(Request(text=text, key=key, untrusted=untrusted))
        with self.pool.admitted():
            try:
                reply = await self._exchange(await self._link((tenant, session)), payload)
            except LinkLost:
                # The worker died with the request in flight: sent again by key, by the
                # client's own retry (a new connection, then the log's answer if applied).
                return await self.pool.run_admitted(
                    lambda c: c.send(session, text, key=key, untrusted=untrusted), tenant
                )
        return _answer_of(reply)

    def send_nowait(
        self,
        session: str,
        text: str,
        *,
        key: str,
        untrusted: bool,
        tenant: str | None,
        done: Callable[[Message | ControlError], None],
    ) -> bool:
        """``send`` without a task, on (tenant, session)'s kept connection: ``done`` is
        called later, on the loop, with its answer or its ControlError. False, nothing
        sent and ``done`` never called, when no connection is kept or the pool is full
        (``send`` answers those)."""
        link = self._links.get((tenant, session))
        if link is None or link.lost or self.pool.in_flight >= MAX_IN_FLIGHT:
            return False
        payload = payload_of(Request(text=text, key=key, untrusted=untrusted))

        def replied(outcome: Outcome) -> None:
            if isinstance(outcome, LinkLost) and not self._closed:
                # As ``send``: the worker died with it in flight, sent again by key.
                retry = asyncio.ensure_future(self.pool.run_admitted(
                    lambda c: c.send(session, text, key=key, untrusted=untrusted), tenant
                ))  # fmt: skip
                retry.add_done_callback(retried)
                return
            self.pool.release()
            if isinstance(outcome, LinkLost):
                done(ControlError("closed", "serve is stopping"))
            elif isinstance(outcome, ControlError):
                done(outcome)
            elif isinstance(outcome, BaseException):
                done(ControlError("bad_reply", str(outcome)))
            else:
                try:
                    done(_answer_of(outcome))
                except ControlError as exc:
                    done(exc)

        def retried(task: asyncio.Future[Message]) -> None:
            self.pool.release()
            if task.cancelled():
                done(ControlError("closed", "serve is stopping"))
            elif isinstance(failure := task.exception(), ControlError):
                done(failure)
            elif failure is not None:
                # Its name and stack to serve's log, not to the client (they may name the
                # home's paths): answered as any other error on a request's path.
                asyncio.get_running_loop().call_exception_handler(
                    {"message": "an HTTP send's retry failed", "exception": failure}
                )
                done(ControlError("internal", "serve failed to answer this request"))
            else:
                result = task.result()
                done(result if isinstance(result, dict) else {"result": result})

        self._links.move_to_end((tenant, session))
        try:
            link.request(payload, replied)
        except (LinkLost, ControlError):
            return False  # ``send`` meets it again and answers it
        self.pool.admit()
        return True

    def forget(self, link: WorkerLink) -> None:
        """Drop ``link`` (its connection ended) if it is still the one kept for its key."""
        if self._links.get(link.key) is link:
            del self._links[link.key]

    def close(self) -> None:
        """Close every connection (on the loop, when the port stops)."""
        self._closed = True
        for link in list(self._links.values()):
            link.close()
        self._links.clear()

    async def _exchange(self, link: WorkerLink, payload: Message) -> Message:
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()

        def replied(outcome: Outcome) -> None:
            if future.done():
                return
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

        request_id = link.request(payload, replied)  # ControlError timeout, by the link
        try:
            return await future
        finally:
            if not future.done():
                link.abandon(request_id)

    async def _link(self, key: _Key) -> WorkerLink:
        link = self._links.get(key)
        if link is not None:
            self._links.move_to_end(key)
            return link
        opening = self._opening.get(key)
        if opening is None:  # the first request to open it; the others wait for it
            opening = self._opening[key] = asyncio.ensure_future(self._open(key))
            opening.add_done_callback(lambda _done: self._opening.pop(key, None))
        return await asyncio.shield(opening)

    async def _open(self, key: _Key) -> WorkerLink:
        tenant, session = key
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + RETRY_FOR
        sock = await self.pool.run_admitted(lambda c: c.connect(session, deadline), tenant)
        try:
            _transport, link = await loop.create_unix_connection(
                lambda: WorkerLink(self, key), sock=sock
            )
        except BaseException:
            sock.close()
            raise
        if not link.lost:
            self._links[key] = link
            self._trim()
        return link

    def _trim(self) -> None:
        """Close the least recently used idle connections past ``MAX_LINKS``."""
        idle = [k for k, link in self._links.items() if not link.waiting]
        for key in idle[: max(0, len(idle) - MAX_LINKS)]:
            self._links.pop(key).close()


def _answer_of(reply: Message) -> Message:
    """``Client.send``'s answer of a reply frame; its ControlError raised."""
    result = result_of(reply)
    return result if isinstance(result, dict) else {"result": result}
