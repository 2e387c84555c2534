"""One client must never kill a session's worker: a client gone before its reply (under
the default start method: its App's template forks it), a request id of a mebibyte, a
valid request followed by garbage in the same write. Real daemons, real workers, real
sockets."""

from __future__ import annotations

import socket
import time
from functools import partial
from pathlib import Path
from typing import Any

from supervisor.client import Client, call
from supervisor.client.control import exchange, open_control
from tests.harness.support import poll_until, running_daemon, status
from worker import Session
from worker.ipc.wire import MAX_FRAME, FrameReader, Message, encode
from worker.store.format.records import User

SLOW = ("--app", "tests.apps.edge_apps:SlowApp")


def direct_connection(home: Path, session: str) -> socket.socket:
    """A connection of our own to the session's worker, asked of the daemon (connect)."""
    control = open_control(str(home), 10)
    try:
        replies, fds = exchange(
            control, encode({"id": 1, "op": "connect", "session": session}), 1,
            time.monotonic() + 10,
        )  # fmt: skip
    finally:
        control.close()
    assert replies[0]["ok"] is True, replies
    assert len(fds) == 1
    link = socket.socket(fileno=fds[0])
    link.settimeout(20)
    return link


def read_replies(sock: socket.socket, wanted: int) -> list[dict[str, Any]]:
    reader = FrameReader()
    replies: list[dict[str, Any]] = []
    while len(replies) < wanted:
        data = sock.recv(1 << 16)
        assert data, f"end of stream after {replies}"
        replies += reader.feed(data)
    return replies


def keys_in_log(home: Path, session: str) -> list[str]:
    with Session.open(home, session) as opened:
        return [str(r.key) for r in opened.records if isinstance(r, User)]


def test_clients_that_close_before_their_reply_leave_a_forked_worker_alive(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, *SLOW):  # the default start method: from a template
        call(str(home), "create", session="s")
        first: dict[str, Any] = status(home, "s")
        marker = home / f"sleeping-{first['pid']}"
        for n in range(3):
            key = f"gone-{n}"
            applied = first["records"] + 4 * (n + 1)
            link = direct_connection(home, "s")
            request: Message = {"text": "sleep 0.3", "key": key}
            link.sendall(encode({"id": 1, "op": "request", "request": request}))
            poll_until(partial(_marked, marker, key), what="the worker to be in the request")
            link.close()  # like a Ctrl-C'd `loopd send`: its reply finds nobody
            # The worker writes the reply to a closed connection, then reports its state.
            poll_until(partial(_applied_or_restarted, home, first["pid"], applied),
                       what="the request to be applied")  # fmt: skip
            row = status(home, "s")
            assert (row["pid"], row["restarts"]) == (first["pid"], 0), "the worker died"
        with Client(str(home)) as client:
            assert client.send("s", "after", key="after")["duplicate"] is False
            for n in range(3):  # each was applied once, and is answered from the log
                assert client.send("s", "sleep 0.3", key=f"gone-{n}")["duplicate"] is True
        row = status(home, "s")
        assert (row["pid"], row["restarts"], row["state"]) == (first["pid"], 0, "RUNNING")
    assert keys_in_log(home, "s") == ["gone-0", "gone-1", "gone-2", "after"]


def _marked(marker: Path, key: str) -> bool:
    return marker.exists() and marker.read_text() == key


def _applied_or_restarted(home: Path, pid: object, records: int) -> bool:
    row = status(home, "s")
    return row["records"] == records or row["pid"] != pid


def test_a_request_id_of_a_mebibyte_is_refused_and_the_worker_serves_on(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home):
        call(str(home), "create", session="s")
        first = status(home, "s")["pid"]
        link = direct_connection(home, "s")
        request: Message = {"text": "hello", "key": "huge-id"}
        overhead = len(encode({"id": "", "op": "request", "request": request})) + 4
        # The request fits a frame (the worker reads it whole), any reply with its id not.
        huge: Message = {
            "id": "i" * (MAX_FRAME - overhead - 16),
            "op": "request",
            "request": request,
        }
        frame = encode(huge)
        assert MAX_FRAME - 32 <= len(frame) <= MAX_FRAME
        link.sendall(frame)
        link.sendall(encode({"id": 2, "op": "request", "request": {"text": "hi", "key": "k2"}}))
        refused, answered = read_replies(link, 2)
        link.close()
        assert refused["id"] is None
        assert refused["error"] == {
            "code": "bad_request",
            "message": "field 'id' must be an int or a string of at most 256 characters",
        }
        assert answered["id"] == 2
        assert answered["ok"] is True
        row = status(home, "s")
        assert (row["pid"], row["restarts"]) == (first, 0)
    assert keys_in_log(home, "s") == ["k2"]  # the refused request was never applied


def test_a_valid_request_and_garbage_in_one_write_get_the_reply_then_the_bad_frame(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home):
        call(str(home), "create", session="s")
        link = direct_connection(home, "s")
        request: Message = {"id": 7, "op": "request", "request": {"text": "hello", "key": "k1"}}
        link.sendall(encode(request) + b"\xc1 this is not msgpack")
        applied, bad = read_replies(link, 2)
        assert applied["id"] == 7
        assert applied["ok"] is True
        assert applied["result"]["duplicate"] is False
        assert bad["id"] is None
        assert bad["error"]["code"] == "bad_frame"
        # The connection reads on from a clean state.
        link.sendall(encode({"id": 8, "op": "request", "request": {"text": "x", "key": "k2"}}))
        (after,) = read_replies(link, 1)
        assert after["id"] == 8
        assert after["ok"] is True
        link.close()
    assert keys_in_log(home, "s") == ["k1", "k2"]


def test_the_daemon_answers_what_came_before_a_bad_frame_then_the_bad_frame(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home):
        call(str(home), "create", session="s")
        control = open_control(str(home), 20)
        send: Message = {
            "id": "relayed",
            "op": "send",
            "session": "s",
            "text": "hello",
            "key": "k1",
        }
        control.sendall(encode({"id": 1, "op": "ping"}) + encode(send) + b"\xc1 garbage")
        replies = read_replies(control, 3)
        assert control.recv(1 << 16) == b""  # then it closes: what follows cannot be read
        control.close()
        by_id = {reply["id"]: reply for reply in replies}
        assert by_id[1]["ok"] is True
        assert isinstance(by_id[1]["result"]["pid"], int)
        assert by_id["relayed"]["ok"] is True  # the relayed send was applied and answered
        assert by_id[None]["error"]["code"] == "bad_frame"
        assert replies[-1]["id"] is None  # the bad frame is answered last
    assert keys_in_log(home, "s") == ["k1"]
