"""One HTTP connection of a real ``loopd serve --http`` against clients that pipeline,
send what the worker's wire cannot carry, never read, or read late (the three faults a
review found in the port's connection rewrite, and the two it had before)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from supervisor.http.limits import MAX_REQUESTS_PER_CONNECTION
from supervisor.http.parser import KEEP_ALIVE_IDLE
from tests.harness.etcd_server import free_port
from tests.harness.http_client import Api
from tests.harness.support import Daemon, log_user_keys, poll_until, running_daemon

ANSWER_WAIT = 60.0
"""Seconds a client waits for serve's next bytes: generous at a load of 10."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Served:
    api: Api
    daemon: Daemon
    home: Path


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    port = free_port()
    args = ("--http", f"127.0.0.1:{port}", "--app", "tests.apps.http_apps:SlowStreamApp")
    with running_daemon(tmp_path / "home", *args) as daemon:
        api = Api(port)
        status, _ = api.ask("POST", "/v1/sessions", {"id": "s"})
        assert status == 201
        yield Served(api=api, daemon=daemon, home=tmp_path / "home")
        api.conn.close()


def _send(key: str, body: bytes | None = None, *, close: bool = False) -> bytes:
    body = json.dumps({"text": key}).encode() if body is None else body
    return (
        f"POST /v1/sessions/s/requests HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        + ("Connection: close\r\n" if close else "") + "\r\n"
    ).encode() + body  # fmt: skip


def _get(path: str, *, close: bool = False) -> bytes:
    extra = "Connection: close\r\n" if close else ""
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()


def _until_closed(sock: socket.socket) -> bytes:
    """Everything serve sends until it closes the connection."""
    sock.settimeout(ANSWER_WAIT)
    chunks = []
    while chunk := sock.recv(1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def _answers(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Each answer of a byte stream: status, headers (lower-cased names), body."""
    answers = []
    while data:
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        length = int(headers["content-length"])
        answers.append((int(lines[0].split(" ")[1]), headers, data[:length]))
        data = data[length:]
    return answers


def _stuck_connections(daemon: Daemon, port: int) -> list[str]:
    """serve's connections on its HTTP port that the peer has closed and serve has not."""
    found = psutil.Process(daemon.proc.pid).net_connections(kind="tcp")
    return [c.status for c in found if c.laddr and c.laddr.port == port and
            c.status == psutil.CONN_CLOSE_WAIT]  # fmt: skip


BAD_INPUT = {
    # JSON may escape half of a surrogate pair; msgpack cannot encode the string.
    "lone-surrogate": b'{"text": "\\ud800"}',
    # Deeper than Python's recursion limit: json.loads raises RecursionError.
    "deep-nesting": b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("body", BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_pipelined_between_sends_is_answered_400_and_the_connection_goes_on(
    served: Served, body: bytes
) -> None:
    # The first send opens the port's connection to the worker: the pipelined ones are
    # answered by its callbacks, the bad one read from within them.
    key = {"Idempotency-Key": "p0"}
    assert served.api.ask("POST", "/v1/sessions/s/requests", {"text": "p0"}, key)[0] == 200
    clients = []
    for round_ in range(3):
        sock = socket.create_connection(("127.0.0.1", served.api.port), timeout=ANSWER_WAIT)
        clients.append(sock)
        sock.sendall(_send(f"a{round_}") + _send("bad", body) + _send(f"c{round_}", close=True))
        answers = _answers(_until_closed(sock))
        assert [status for status, _h, _b in answers] == [200, 400, 200], answers
        assert json.loads(answers[1][2])["error"]["code"] == "bad_request"
        assert answers[1][1]["connection"] == "keep-alive"
    # A lone bad request on a connection of its own, answered on a task: the same 400.
    single = socket.create_connection(("127.0.0.1", served.api.port), timeout=ANSWER_WAIT)
    clients.append(single)
    single.sendall(_send("bad", body, close=True))
    assert [a[0] for a in _answers(_until_closed(single))] == [400]
    for sock in clients:
        sock.close()
    # Nothing serve holds for them once they are gone (a connection left open for good
    # held its slot: enough of them and the port answered 503 to everyone).
    poll_until(
        lambda: not _stuck_connections(served.daemon, served.api.port),
        timeout=ANSWER_WAIT,
        what="serve to close the connections the peer closed",
    )
    assert log_user_keys(served.home, "s") == ["p0", "a0", "c0", "a1", "c1", "a2", "c2"]


SENT_AT_MOST = 96 << 20
"""Bytes of requests a client that never reads tries to send."""


@pytest.mark.timeout(300)
def test_a_client_that_never_reads_its_answers_stops_being_read_and_serve_stays_small(
    served: Served,
) -> None:
    serve = psutil.Process(served.daemon.proc.pid)
    before = serve.memory_info().rss
    requests = _get("/v1/openapi.json") * 1000  # each answered with 14 KB
    sent = 0
    with socket.socket() as sock:
        # A small window: its answers fill serve's side at once.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
        sock.connect(("127.0.0.1", served.api.port))
        # A send that blocks this long means serve stopped reading (which is the point);
        # a serve that reads on takes every byte offered.
        sock.settimeout(10.0)
        with contextlib.suppress(TimeoutError):
            while sent < SENT_AT_MOST:
                sent += sock.send(requests)
        grown = serve.memory_info().rss - before
    # The kernel's buffers (serve's receive buffer grows to 32 MiB) take some; serve's
    # own, a read ahead and one write buffer.
    assert sent < SENT_AT_MOST * 2 // 3, f"serve read {sent >> 20} MiB a client never read"
    assert grown < 32 << 20, f"serve grew by {grown >> 20} MiB"
    fresh = Api(served.api.port)  # the fixture's connection idled past its deadline
    assert fresh.ask("GET", "/v1/sessions/s")[0] == 200  # and serve still serves
    fresh.conn.close()


@pytest.mark.timeout(300)
def test_a_slow_readers_pipelined_requests_are_all_answered_past_the_idle_deadline(
    served: Served,
) -> None:
    count = 600  # 8.5 MB of answers: more than the kernel's buffers hold
    requests = _get("/v1/openapi.json") * (count - 1) + _get("/v1/openapi.json", close=True)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", served.api.port))
        sock.sendall(requests)
        # The client's own pace: it reads nothing for longer than the idle deadline,
        # while serve holds requests it received and has not answered.
        time.sleep(KEEP_ALIVE_IDLE + 2)
        answers = _answers(_until_closed(sock))
    assert [status for status, _h, _b in answers] == [200] * count
    assert answers[-1][1]["connection"] == "close"


def test_the_last_answer_a_connection_serves_says_connection_close(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", served.api.port), timeout=ANSWER_WAIT) as sock:
        sock.sendall(_get("/v1/nothing") * (MAX_REQUESTS_PER_CONNECTION + 5))
        answers = _answers(_until_closed(sock))
    assert len(answers) == MAX_REQUESTS_PER_CONNECTION  # then closed, the rest unread
    said = [headers["connection"] for _s, headers, _b in answers]
    assert said == ["keep-alive"] * (MAX_REQUESTS_PER_CONNECTION - 1) + ["close"]


ALLOWED = {
    "sessions": ("PUT", "/v1/sessions", "GET, POST"),
    "requests": ("GET", "/v1/sessions/s/requests", "POST"),
    "openapi": ("POST", "/v1/openapi.json", "GET"),
}


@pytest.mark.parametrize(("method", "path", "allow"), ALLOWED.values(), ids=ALLOWED.keys())
def test_another_method_is_answered_405_with_the_methods_allowed(
    served: Served, method: str, path: str, allow: str
) -> None:
    served.api.conn.request(method, path, body=b"{}", headers={"Content-Type": "application/json"})
    answer = served.api.conn.getresponse()
    document = json.loads(answer.read())
    assert (answer.status, answer.headers["Allow"]) == (405, allow)
    assert document["error"] == {
        "code": "bad_request", "message": f"{method} is not served here (allowed: {allow})",
    }  # fmt: skip


def _head_only(key: str, body: bytes, expect: str) -> bytes:
    return (
        f"POST /v1/sessions/s/requests HTTP/1.1\r\nHost: x\r\nIdempotency-Key: {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Expect: {expect}\r\nConnection: close\r\n\r\n"
    ).encode()


def test_a_body_sent_after_100_continue_is_served_and_another_expectation_refused_417(
    served: Served,
) -> None:
    body = json.dumps({"text": "waits"}).encode()
    with socket.create_connection(("127.0.0.1", served.api.port), timeout=ANSWER_WAIT) as sock:
        # curl's way with a larger body: the head, then the body only once told to go on
        # (curl gives up waiting after 1 s; a client may wait longer).
        sock.sendall(_head_only("waits", body, "100-continue"))
        interim = sock.recv(len(b"HTTP/1.1 100 Continue\r\n\r\n"), socket.MSG_WAITALL)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        answers = _answers(_until_closed(sock))
    assert [a[0] for a in answers] == [200], answers
    with socket.create_connection(("127.0.0.1", served.api.port), timeout=ANSWER_WAIT) as sock:
        sock.sendall(_head_only("refused", body, "something-else") + body)
        answers = _answers(_until_closed(sock))
    assert [a[0] for a in answers] == [417], answers
    assert "something-else" in json.loads(answers[0][2])["error"]["message"]
    with socket.create_connection(("127.0.0.1", served.api.port), timeout=ANSWER_WAIT) as sock:
        # The body already sent with the head: no interim answer, the request's alone.
        sock.sendall(_head_only("at-once", body, "100-Continue") + body)
        data = _until_closed(sock)
    assert data.startswith(b"HTTP/1.1 200 OK\r\n"), data[:80]
    assert log_user_keys(served.home, "s") == ["waits", "at-once"]


def test_empty_lines_before_a_request_line_are_ignored(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", served.api.port), timeout=ANSWER_WAIT) as sock:
        # RFC 9112 2.2 (an old client's CRLF after a body): the first request's CR and LF
        # come apart, the second's two empty lines come with it.
        sock.sendall(b"\r")
        sock.sendall(b"\n" + _send("e1") + b"\r\n\r\n" + _send("e2", close=True))
        answers = _answers(_until_closed(sock))
    assert [a[0] for a in answers] == [200, 200], answers
    assert log_user_keys(served.home, "s") == ["e1", "e2"]


def test_a_query_number_longer_than_a_count_holds_is_refused_not_cut(served: Served) -> None:
    status, document = served.api.ask("GET", "/v1/sessions/s/records?since=" + "1" * 19)
    assert status == 400, document
    assert document["error"]["message"] == "query 'since' must be one number of at most 18 digits"
    status, document = served.api.ask("GET", "/v1/sessions/s/records?since=" + "0" * 17 + "1")
    assert status == 200, document
