"""A client that stops reading: serve's unsent bytes to it cannot leave. While the
transport's writing is paused nothing else happens on the connection (no request is read,
no idle deadline runs), and a close waits for them: either way the connection's
descriptor and its slot among ``MAX_CONNECTIONS`` were held for as long as the client
kept its socket (a review found the close in the port's connection rewrite). Past
``WRITE_STALL`` seconds without a byte taken the connection is aborted.

On a real socket and loop, the connection's own object looked at (its phase, what its
transport holds): the premise is checked, not assumed.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.http import connection
from supervisor.http.calls import ClientPool
from supervisor.http.connection import HttpConnection
from supervisor.http.parser import HttpRequest
from supervisor.http.phases import Phase
from supervisor.http.responses import Writer, response
from supervisor.http.routes import Api

WAIT = 60.0
STALL = 0.5
BIG = 60_000
LAST = 16 << 20
"""More than the kernel's buffers take (its send buffer grows to 4 MiB): the rest waits in the
transport when serve closes its side."""


class BigApi(Api):
    """``GET /big``: a 60 kB answer, kept alive; ``GET /last``: a 16 MiB one, then closed."""

    def answer_nowait(
        self, request: HttpRequest, writer: Writer, answered: Callable[[bool], None]
    ) -> bool:
        keep = request.target == "/big"
        writer.write(response(200, b"x" * (BIG if keep else LAST), keep_alive=keep))
        answered(keep)
        return True

    async def answer(self, request: HttpRequest, writer: Writer) -> bool:
        raise AssertionError("every request is answered by answer_nowait")


def _get(target: str) -> bytes:
    return f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


async def _until(check: Callable[[], bool], what: str) -> None:
    async with asyncio.timeout(WAIT):
        while not check():
            await asyncio.sleep(0.01)  # polled against WAIT
    assert check(), what


async def _stalled(tmp_path: Path, requests: bytes, premise: Callable[[HttpConnection], bool]
                   ) -> tuple[bool, int]:  # fmt: skip
    """Send ``requests`` and never read: whether ``premise`` held of the connection before
    serve let go of it, and the connections open at the end."""
    loop = asyncio.get_running_loop()
    api = BigApi(ClientPool(str(tmp_path)))
    opened: set[HttpConnection] = set()
    server = await loop.create_server(lambda: HttpConnection(api, opened), "127.0.0.1", 0)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.setblocking(False)
    try:
        await loop.sock_connect(client, server.sockets[0].getsockname())
        await _until(lambda: len(opened) == 1, "serve to take the connection")
        (conn,) = opened
        await loop.sock_sendall(client, requests)
        await _until(lambda: premise(conn) or not opened, "the premise")
        held = bool(opened) and premise(conn)
        await _until(lambda: not opened, "serve to let go of the connection")
        return held, len(opened)
    finally:
        client.close()
        server.close()
        await server.wait_closed()


def _paused_and_idle(conn: HttpConnection) -> bool:
    # Each request answered, and the last answers still in the transport, its writing
    # paused: nothing more happens on this connection until the peer reads.
    return conn._writing_paused and conn._phase is Phase.IDLE


def _closed_with_unsent(conn: HttpConnection) -> bool:
    transport = conn._transport
    unsent = transport.get_write_buffer_size() if transport is not None else 0
    return conn._phase is Phase.CLOSED and unsent > 0


CASES = {
    # Answers pile up past the kernel's buffers: writing pauses with nothing unanswered.
    "writing-paused": (_get("/big") * 200, _paused_and_idle),
    # The last answer, past the kernel's buffers, then serve's close.
    "closed": (_get("/last"), _closed_with_unsent),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("requests", "premise"), CASES.values(), ids=CASES.keys())
def test_a_connection_whose_client_stopped_reading_is_aborted_at_the_write_stall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, requests: bytes,
    premise: Callable[[HttpConnection], bool],
) -> None:  # fmt: skip
    monkeypatch.setattr(connection, "WRITE_STALL", STALL)
    held, still_open = asyncio.run(_stalled(tmp_path, requests, premise))
    assert held, "the premise did not hold before serve let go"
    assert still_open == 0
