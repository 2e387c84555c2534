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
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict
from typing import Final

from supervisor.client.control import result_of
from supervisor.client.direct import Request, payload_of
from supervisor.errors import ControlError
from supervisor.http.calls import RETRY_FOR, ClientPool
from worker.ipc.wire import FrameReader, Message, WireError, encode

MAX_LINKS: Final = 256
"""Connections to workers kept open with no request in flight (those in flight are
bounded by ``calls.MAX_IN_FLIGHT``)."""
REPLY_TIMEOUT: Final = 60.0
"""Seconds a worker has to answer a request: ``Client``'s timeout."""

_Key = tuple[str | None, str]  # (tenant, session)


class LinkLost(Exception):
    """The connection ended before the request's reply: the worker died or was replaced."""


class WorkerLink(asyncio.Protocol):
    """One direct connection to a session's worker, read by the loop; replies by id."""

    def __init__(self, links: WorkerLinks, key: _Key) -> None:
        self.key = key
        self.waiting: dict[int, asyncio.Future[Message]] = {}
        self.lost = False
        self._links = links
        self._transport: asyncio.Transport | None = None
        self._reader = FrameReader()
        self._ids = itertools.count(1)

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
            future = self.waiting.pop(request_id, None) if type(request_id) is int else None
            if future is not None and not future.done():
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._links.forget(self)
        self._fail(LinkLost())

    def request(self, payload: Message) -> asyncio.Future[Message]:
        """Write one request's frame; the future of its reply (LinkLost if the connection
        ends first). ControlError ``too_large`` (nothing sent) past the frame limit."""
        if self.lost or self._transport is None:
            raise LinkLost
        request_id = next(self._ids)
        try:
            frame = encode({"id": request_id, "op": "request", "request": payload})
        except WireError as exc:
            raise ControlError("too_large", str(exc)) from exc
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self.waiting[request_id] = future
        self._transport.write(frame)
        return future

    def abandon(self, future: asyncio.Future[Message]) -> None:
        """Stop waiting for ``future``'s reply (its request timed out or was cancelled)."""
        for request_id, waiting in list(self.waiting.items()):
            if waiting is future:
                del self.waiting[request_id]

    def close(self) -> None:
        if self._transport is not None:
            self._transport.abort()  # connection_lost follows, on the loop

    def _fail(self, exc: Exception) -> None:
        waiting, self.waiting = self.waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(exc)


class WorkerLinks:
    """The port's connections to workers, by (tenant, session); ``send`` on the loop."""

    def __init__(self, pool: ClientPool) -> None:
        self.pool = pool
        self._links: OrderedDict[_Key, WorkerLink] = OrderedDict()
        self._opening: dict[_Key, asyncio.Task[WorkerLink]] = {}

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
        result = result_of(reply)
        return result if isinstance(result, dict) else {"result": result}

    def forget(self, link: WorkerLink) -> None:
        """Drop ``link`` (its connection ended) if it is still the one kept for its key."""
        if self._links.get(link.key) is link:
            del self._links[link.key]

    def close(self) -> None:
        """Close every connection (on the loop, when the port stops)."""
        for link in list(self._links.values()):
            link.close()
        self._links.clear()

    async def _exchange(self, link: WorkerLink, payload: Message) -> Message:
        future = link.request(payload)
        try:
            async with asyncio.timeout(REPLY_TIMEOUT):
                return await future
        except TimeoutError as exc:
            session = link.key[1]
            raise ControlError(
                "timeout", f"session {session} did not answer within {REPLY_TIMEOUT:g} s"
            ) from exc
        finally:
            if not future.done():
                link.abandon(future)

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
