"""An error other than HttpError on a request's path, raised at the seam the connection
really calls (``Api.answer_nowait``, ``Api.answer``), on a real socket and loop: one 500
answer in the port's JSON error shape, or, once an answer began, the connection ended."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.errors import ControlError
from supervisor.http.calls import ClientPool
from supervisor.http.connection import HttpConnection
from supervisor.http.parser import HttpRequest
from supervisor.http.responses import Writer, response
from supervisor.http.routes import Api
from supervisor.http.worker_links import LinkLost, WorkerLinks

WAIT = 60.0


class FailingApi(Api):
    """Answers ``GET /ok`` 200; ``/raise-nowait`` raises in ``answer_nowait``,
    ``/raise`` in ``answer`` before writing, ``/raise-late`` after writing a head."""

    def answer_nowait(
        self, request: HttpRequest, writer: Writer, answered: Callable[[bool], None]
    ) -> bool:
        if request.target == "/raise-nowait":
            raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
        return False

    async def answer(self, request: HttpRequest, writer: Writer) -> bool:
        if request.target == "/raise":
            raise RecursionError("maximum recursion depth exceeded")
        if request.target == "/raise-late":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
            raise RuntimeError("after the answer began")
        writer.write(response(200, b'{"ok": true}', keep_alive=request.keep_alive))
        return request.keep_alive


async def _exchange(tmp_path: Path, data: bytes) -> tuple[bytes, list[BaseException], int]:
    """What serve answers ``data`` until it closes, the errors it reported, and the
    connections still open then."""
    loop = asyncio.get_running_loop()
    reported: list[BaseException] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context["exception"]))
    api = FailingApi(ClientPool(str(tmp_path)))
    open_connections: set[HttpConnection] = set()
    server = await loop.create_server(lambda: HttpConnection(api, open_connections), "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(data)
        answer = await asyncio.wait_for(reader.read(), WAIT)  # until serve closes
        writer.close()
        await writer.wait_closed()
        async with asyncio.timeout(WAIT):
            while open_connections:  # serve's side ends on the loop's next turns
                await asyncio.sleep(0.01)
        return answer, reported, len(open_connections)
    finally:
        server.close()
        await server.wait_closed()


def _get(target: str) -> bytes:
    return f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


CASES = {
    "in-answer-nowait": "/raise-nowait",
    "in-answer": "/raise",
}


@pytest.mark.parametrize("target", CASES.values(), ids=CASES.keys())
def test_an_unexpected_error_pipelined_after_an_answer_is_answered_500_and_closed(
    tmp_path: Path, target: str
) -> None:
    data = _get("/ok") + _get(target) + _get("/ok")
    answer, reported, still_open = asyncio.run(_exchange(tmp_path, data))
    first, second = answer.split(b"HTTP/1.1 ")[1:]
    assert first.startswith(b"200 OK\r\n")
    head, _, body = second.partition(b"\r\n\r\n")
    assert head.startswith(b"500 Internal Server Error\r\n")
    assert b"\r\nConnection: close" in head
    assert json.loads(body) == {
        "error": {"code": "internal", "message": "serve failed to answer this request"}
    }
    assert [type(exc) for exc in reported] == [UnicodeEncodeError if "nowait" in target
                                               else RecursionError]  # fmt: skip
    assert still_open == 0


def test_an_unexpected_error_after_an_answer_began_ends_the_connection_with_no_second_answer(
    tmp_path: Path,
) -> None:
    answer, reported, still_open = asyncio.run(_exchange(tmp_path, _get("/raise-late")))
    assert answer == b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf"
    assert [type(exc) for exc in reported] == [RuntimeError]
    assert still_open == 0


class _DyingLink:
    """A kept worker connection whose request is lost with its worker (``LinkLost``)."""

    lost = False

    def request(self, payload: object, replied: Callable[[object], None]) -> int:
        asyncio.get_running_loop().call_soon(replied, LinkLost())
        return 1


async def _retry_failing(tmp_path: Path) -> tuple[object, list[BaseException]]:
    loop = asyncio.get_running_loop()
    reported: list[BaseException] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context["exception"]))
    pool = ClientPool(str(tmp_path))

    async def failing(call: object, tenant: str | None = None) -> object:
        raise RuntimeError(f"{tmp_path}/a path of the home")  # not a ControlError

    pool.run_admitted = failing  # type: ignore[method-assign,assignment]
    links = WorkerLinks(pool)
    links._links[(None, "s")] = _DyingLink()  # type: ignore[assignment]
    answer: asyncio.Future[object] = loop.create_future()
    assert links.send_nowait("s", "t", key="k", untrusted=False, tenant=None,
                             done=answer.set_result)  # fmt: skip
    return await asyncio.wait_for(answer, WAIT), reported


def test_an_unexpected_error_in_a_retried_send_is_logged_and_answered_without_its_text(
    tmp_path: Path,
) -> None:
    outcome, reported = asyncio.run(_retry_failing(tmp_path))
    assert isinstance(outcome, ControlError)
    assert (outcome.code, outcome.message) == ("internal", "serve failed to answer this request")
    assert [type(exc) for exc in reported] == [RuntimeError]  # its text in serve's log only
