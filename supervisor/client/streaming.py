"""A request whose App streams partial output: the partials as they come, then the reply.

The worker sends ``{"id", "partial": text}`` frames for a request that asked for them
(``"stream": true`` in its payload) while its App calls ``worker.app.turn.stream``, then
the one reply frame. Partials are not durable: if the worker dies mid-stream, the
request is sent again with its key and the new worker's partials start from the
beginning (``Stream.restarts`` counts how often); what was applied is answered once.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Final, Protocol

from supervisor.client.control import READ_SIZE, RETRYABLE, result_of
from supervisor.errors import ControlError
from worker.ipc.wire import FrameReader, Message, WireError, encode

_RETRY_PAUSE: Final = 0.02


class Connections(Protocol):
    """What a stream needs of its client (passed in: the client imports this module)."""

    timeout: float
    retry_for: float

    def link(self, session: str, deadline: float) -> socket.socket: ...
    def drop(self, session: str) -> None: ...
    def next_id(self) -> int: ...


class Stream:
    """Iterate for the partial texts; ``reply`` holds the result once iteration ends."""

    def __init__(self, client: Connections, session: str, payload: Message) -> None:
        self._client = client
        self._session = session
        self._payload = {**payload, "stream": True}
        self.reply: Message | None = None
        self.restarts = 0

    def __iter__(self) -> Iterator[str]:
        finished = False
        try:
            yield from self._frames()
            finished = True
        finally:
            if not finished:
                # Abandoned (a break, an error): what is still on its way for this request
                # must not be read as the answer to the next one.
                self._client.drop(self._session)

    def _frames(self) -> Iterator[str]:
        client, session = self._client, self._session
        deadline = time.monotonic() + client.retry_for
        while True:
            sock = client.link(session, deadline)
            request_id = client.next_id()
            frame = encode({"id": request_id, "op": "request", "request": self._payload})
            try:
                if sock.gettimeout() is not None:
                    sock.settimeout(None)  # blocking, bounded by SO_RCVTIMEO
                sock.sendall(frame)
                reader = FrameReader()
                while True:
                    data = sock.recv(READ_SIZE)
                    if not data:
                        raise ConnectionResetError("end of stream")
                    for message in reader.feed(data):
                        if message.get("id") != request_id:
                            raise ControlError(
                                "bad_reply", f"a frame of another request: {message!r}"
                            )
                        partial = message.get("partial")
                        if isinstance(partial, str):
                            yield partial
                            continue
                        result = result_of(message)
                        self.reply = result if isinstance(result, dict) else {"result": result}
                        return
            except BlockingIOError as exc:
                client.drop(session)
                raise ControlError(
                    "timeout", f"session {session} sent nothing for {client.timeout:g} s"
                ) from exc
            except WireError as exc:
                client.drop(session)
                raise ControlError("bad_reply", str(exc)) from exc
            except ControlError as exc:
                if exc.code not in RETRYABLE or time.monotonic() > deadline:
                    raise
                time.sleep(_RETRY_PAUSE)  # the worker restarts; its supervisor queues us
            except OSError as exc:
                client.drop(session)
                if time.monotonic() > deadline:
                    raise ControlError(
                        "worker_died", f"the worker of session {session} kept dying: {exc}"
                    ) from exc
            self.restarts += 1
