"""The HTTP API of ``loopd serve --http`` against a real server, with http.client."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.http.parser import HEADER_DEADLINE
from supervisor.http.routes import ROUTES
from tests.harness.etcd_server import free_port
from tests.harness.http_client import Api
from tests.harness.support import log_user_keys, running_daemon

SPEC = Path(__file__).parents[2] / "supervisor" / "http" / "openapi.json"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Api]:
    port = free_port()
    args = ("--http", f"127.0.0.1:{port}", "--app", "tests.apps.http_apps:SlowStreamApp")
    with running_daemon(tmp_path / "home", *args):
        api = Api(port)
        status, _ = api.ask("POST", "/v1/sessions", {"id": "s"})
        assert status == 201
        yield api
        api.conn.close()


def test_a_send_retried_with_its_idempotency_key_is_applied_once_with_the_first_answer(
    served: Api,
) -> None:
    key = {"Idempotency-Key": "order-1"}
    status, first = served.ask("POST", "/v1/sessions/s/requests", {"text": "hi"}, key)
    assert (status, first["duplicate"], first["text"]) == (200, False, "echo: hi")
    status, again = served.ask("POST", "/v1/sessions/s/requests", {"text": "hi"}, key)
    assert (status, again["duplicate"], again["text"]) == (200, True, "echo: hi")
    status, row = served.ask("GET", "/v1/sessions/s")
    assert (status, row["session"], row["state"]) == (200, "s", "RUNNING")
    status, page = served.ask("GET", "/v1/sessions/s/records?since=0&limit=2")
    assert status == 200
    assert [r["type"] for r in page["records"]] == ["SessionStart", "User"]
    status, rest = served.ask("GET", f"/v1/sessions/s/records?since={page['next']}")
    users = [r for r in rest["records"] if r["type"] == "User"]
    assert users == []  # the one User record was on the first page: applied once
    assert rest["next"] == rest["lines"]


def test_errors_are_one_json_object_with_the_wire_code(served: Api) -> None:
    assert served.ask("GET", "/v1/sessions/nope") == (
        404, {"error": {"code": "not_found", "message": "no session 'nope'"}},
    )  # fmt: skip
    status, exists = served.ask("POST", "/v1/sessions", {"id": "s"})
    assert (status, exists["error"]["code"]) == (409, "exists")
    status, missing = served.ask("GET", "/v1/nothing")
    assert (status, missing["error"]["code"]) == (404, "not_found")


def test_the_openapi_document_lists_exactly_the_routes_served(served: Api) -> None:
    status, document = served.ask("GET", "/v1/openapi.json")
    assert status == 200
    assert document == json.loads(SPEC.read_text())
    paths = document["paths"]
    assert isinstance(paths, dict)
    listed = {(m.upper(), p) for p, ops in paths.items() for m in ops}
    assert listed == set(ROUTES)
    for method, path in ROUTES:  # and each is answered by something other than "no endpoint"
        target = path.replace("{id}", "s").replace("{key}", "k")
        status, _ = served.ask(method, target, {"text": "x", "id": "t"})
        assert status != 404, path


WORDS = "one two three four five six"
PARTIALS = [f"{n}:{w}" for n, w in enumerate(WORDS.split())]


def _partials(events: list[tuple[str, str, dict[str, Any]]]) -> list[object]:
    return [data["text"] for _id, kind, data in events if kind == "partial"]


def test_an_event_stream_sends_the_partials_then_the_reply_each_with_an_id(served: Api) -> None:
    events = served.events("/v1/sessions/s/requests", {"text": WORDS}, {"Idempotency-Key": "k"})
    assert [i for i, _k, _d in events] == [str(n) for n in range(1, len(PARTIALS) + 2)]
    assert _partials(events) == PARTIALS
    assert events[-1][1] == "reply"
    assert events[-1][2]["text"] == f"echo: {WORDS}"


def test_a_reconnect_with_last_event_id_resumes_mid_stream_without_gap_or_duplicate(
    served: Api,
) -> None:
    key = {"Idempotency-Key": "resumed"}
    first = served.events("/v1/sessions/s/requests", {"text": WORDS}, key, stop_after=2)
    assert [(i, k) for i, k, _d in first] == [("1", "partial"), ("2", "partial")]
    again = {**key, "Last-Event-ID": first[-1][0]}
    rest = served.events("/v1/sessions/s/requests", {"text": WORDS}, again)
    assert rest[0][0] == "3"  # the turn was still running: it went on where we left
    assert _partials(first + rest) == PARTIALS
    assert rest[-1][1] == "reply"
    assert rest[-1][2]["duplicate"] is False  # one turn, applied once
    status, page = served.ask("GET", "/v1/sessions/s/records")
    users = [r for r in page["records"] if r["type"] == "User"]
    assert status == 200
    assert len(users) == 1


def test_a_reconnect_after_the_turn_finished_gets_the_final_reply(served: Api) -> None:
    key = {"Idempotency-Key": "finished"}
    whole = served.events("/v1/sessions/s/requests", {"text": "a b"}, key)
    last_partial = whole[-2][0]
    again = {**key, "Last-Event-ID": last_partial}
    rest = served.events("/v1/sessions/s/requests", {"text": "a b"}, again)
    assert rest == [whole[-1]]  # the reply alone, with its id


def test_a_reconnect_to_a_restarted_serve_gets_the_reply_from_the_log(tmp_path: Path) -> None:
    port = free_port()
    args = ("--http", f"127.0.0.1:{port}", "--app", "tests.apps.http_apps:SlowStreamApp")
    key = {"Idempotency-Key": "before-restart"}
    with running_daemon(tmp_path / "home", *args):
        api = Api(port)
        api.ask("POST", "/v1/sessions", {"id": "s"})
        whole = api.events("/v1/sessions/s/requests", {"text": "a b"}, key)
        api.conn.close()
    with running_daemon(tmp_path / "home", *args):
        again = {**key, "Last-Event-ID": "2"}
        api = Api(port)
        rest = api.events("/v1/sessions/s/requests", {"text": "a b"}, again)
        api.conn.close()
    assert [(i, k) for i, k, _d in rest] == [("3", "reply")]
    assert rest[0][2]["duplicate"] is True
    assert rest[0][2]["text"] == whole[-1][2]["text"]


def _raw(port: int, data: bytes) -> bytes:
    """Send ``data`` on a new connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        # Refused before it read everything: its answer is still to be read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


SEND = (
    b"POST /v1/sessions/s/requests HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    b"Content-Type: application/json\r\n"
)
BODY = b'{"text": "smuggled"}'
HOSTILE = {
    "two-content-lengths": (
        SEND + b"Content-Length: %d\r\nContent-Length: 0\r\n\r\n" % len(BODY) + BODY,
        400,
    ),
    "chunked-body": (
        SEND + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % len(BODY) + BODY + b"\r\n0\r\n\r\n",
        400,
    ),
    "ten-thousand-headers": (
        SEND + b"".join(b"X-%d: y\r\n" % n for n in range(10_000)) + b"\r\n",
        431,
    ),
    "two-megabyte-body": (SEND + b"Content-Length: %d\r\n\r\n" % (2 << 20) + b"x" * (2 << 20), 413),
    "malformed-json": (SEND + b'Content-Length: 9\r\n\r\n{"text": ', 400),
    "space-before-colon": (SEND + b"Content-Length : 0\r\n\r\n", 400),
}


def test_hostile_requests_get_one_error_each_and_nothing_is_applied(served: Api) -> None:
    for name, (data, expected) in HOSTILE.items():
        answer = _raw(served.port, data)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 %d " % expected), (name, head)
        assert answer.count(b"HTTP/1.1 ") == 1, name
        assert "error" in json.loads(body), name
    status, page = served.ask("GET", "/v1/sessions/s/records")
    assert status == 200  # and serve still serves
    assert [r["type"] for r in page["records"]] == ["SessionStart"]


def _keyed_send(key: str, *, close: bool = False) -> bytes:
    body = json.dumps({"text": key}).encode()
    return (
        f"POST /v1/sessions/s/requests HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        + ("Connection: close\r\n" if close else "") + "\r\n"
    ).encode() + body  # fmt: skip


def test_pipelined_sends_and_a_request_split_across_writes_are_answered_in_order(
    served: Api, tmp_path: Path
) -> None:
    # The first send opens the port's connection to the worker; the next ones ride it
    # (answered by callbacks), two of them in one write, the last one a byte a write.
    assert served.ask("POST", "/v1/sessions/s/requests", {"text": "p0"},
                      {"Idempotency-Key": "p0"})[0] == 200  # fmt: skip
    last = _keyed_send("p3", close=True)
    with socket.create_connection(("127.0.0.1", served.port), timeout=20) as sock:
        sock.sendall(_keyed_send("p1") + _keyed_send("p2"))
        for index in range(len(last)):
            sock.sendall(last[index : index + 1])
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    bodies = [json.loads(part.split(b"\r\n\r\n", 1)[1]) for part in
              answer.split(b"HTTP/1.1 ")[1:]]  # fmt: skip
    assert answer.count(b"HTTP/1.1 200 OK\r\n") == 3, answer[:300]
    assert [(b["key"], b["text"]) for b in bodies] == [
        ("p1", "echo: p1"), ("p2", "echo: p2"), ("p3", "echo: p3"),
    ]  # fmt: skip
    assert log_user_keys(tmp_path / "home", "s") == ["p0", "p1", "p2", "p3"]


def test_a_head_slower_than_the_deadline_is_answered_408_and_closed(served: Api) -> None:
    served.conn.close()  # idle past the keep-alive bound below: closed by the server
    with socket.create_connection(("127.0.0.1", served.port), timeout=20) as sock:
        sock.sendall(b"GET /v1/sessions/s HTTP/1.1\r\nHost: x\r\n")  # and never the end
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert served.ask("GET", "/v1/sessions/s")[0] == 200


def test_a_body_slower_than_the_head_deadline_is_served(served: Api, tmp_path: Path) -> None:
    """The head has HEADER_DEADLINE (5 s), the body BODY_DEADLINE (30 s) after it."""
    body = json.dumps({"text": "slow upload"}).encode()
    head = (
        "POST /v1/sessions/s/requests HTTP/1.1\r\nHost: x\r\nIdempotency-Key: slow\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", served.port), timeout=20) as sock:
        sock.sendall(head + body[:5])
        time.sleep(HEADER_DEADLINE + 1)  # the client's own pace: past the head's deadline
        sock.sendall(body[5:])
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert log_user_keys(tmp_path / "home", "s").count("slow") == 1


def test_a_worker_death_mid_stream_is_a_restart_event_then_the_partials_again(
    tmp_path: Path,
) -> None:
    port = free_port()
    args = ("--http", f"127.0.0.1:{port}", "--app", "tests.apps.slow_apps:DyingStreamApp")
    with running_daemon(tmp_path / "home", *args):
        api = Api(port)
        api.ask("POST", "/v1/sessions", {"id": "s"})
        events = api.events("/v1/sessions/s/requests", {"text": "x"}, {"Idempotency-Key": "d"})
        api.conn.close()
    kinds = [(k, d.get("text")) for _i, k, d in events[:-1]]
    assert kinds == [
        ("partial", "first"), ("partial", "second"), ("restart", None),
        ("partial", "first"), ("partial", "second"),
    ]  # fmt: skip
    assert [i for i, _k, _d in events] == [str(n) for n in range(1, 7)]
    assert (events[-1][1], events[-1][2]["duplicate"]) == ("reply", False)
