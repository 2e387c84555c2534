"""Requests relayed through the daemon (``call(home, "send")``): the daemon<->worker channel
never deadlocks under big pipelined requests, and a relayed reply that just fits a frame
is answered as applied when the client's longer id is put back. Real daemons, workers
and sockets."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from supervisor.client import Client, call
from supervisor.client.control import exchange, open_control
from supervisor.client.direct import Request
from supervisor.errors import ControlError
from tests.harness.support import poll_until, running_daemon, status
from worker import Session
from worker.app.version import app_version
from worker.ipc.wire import MAX_FRAME, MAX_REQUEST_ID, Message, encode
from worker.store.format.records import User

BIG = 400_000
"""Bytes of text per request: its echo comes back, so each reply is as big."""
ONE_EPOCH = ("--budget", "1000000000")
"""No epoch change during the load: every request stays in the retry window."""


def big_text(n: int) -> str:
    return f"{n:06d}" + "t" * (BIG - 6)


def keys_in_log(home: Path, session: str) -> list[str]:
    with Session.open(home, session) as opened:
        return [str(r.key) for r in opened.records if isinstance(r, User)]


def connect_answers(home: Path) -> bool:
    try:
        call(str(home), "connect", session="s", timeout=10)
    except ControlError as exc:
        if exc.code == "busy":
            return False
        raise
    return True


def assert_healthy_after_the_load(home: Path, pid: object) -> None:
    """Every connect is answered (never ``busy`` for good), and the worker never died."""
    poll_until(lambda: connect_answers(home), timeout=30, what="a connect not answered busy")
    for _ in range(5):
        assert connect_answers(home), "connect answered busy after the load"
    row = status(home, "s")
    assert (row["pid"], row["restarts"], row["state"]) == (pid, 0, "RUNNING")


@pytest.mark.timeout(110)
def test_one_client_pipelining_20_relayed_sends_of_400_kb_gets_every_reply(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, *ONE_EPOCH):
        call(str(home), "create", session="s")
        pid = status(home, "s")["pid"]
        frames = b"".join(
            encode({"id": n, "op": "send", "session": "s", "text": big_text(n), "key": f"k{n}"})
            for n in range(20)
        )
        sock = open_control(str(home), 40)
        try:
            replies, _fds = exchange(sock, frames, 20, time.monotonic() + 40)
        finally:
            sock.close()
        answered: dict[Any, Any] = {reply["id"]: reply for reply in replies}
        assert sorted(answered) == list(range(20))
        for n, reply in answered.items():
            assert reply["ok"] is True, reply.get("error")
            assert reply["result"]["duplicate"] is False
            assert reply["result"]["text"] == "echo: " + big_text(n)
        assert_healthy_after_the_load(home, pid)
    assert keys_in_log(home, "s") == [f"k{n}" for n in range(20)]


@pytest.mark.timeout(110)
def test_20_independent_callers_of_relayed_sends_of_400_kb_all_get_their_reply(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, *ONE_EPOCH):
        call(str(home), "create", session="s")
        pid = status(home, "s")["pid"]
        results: dict[int, object] = {}
        start = threading.Barrier(20)

        def caller(n: int) -> None:
            start.wait()
            try:
                results[n] = call(
                    str(home), "send", session="s", text=big_text(n), key=f"k{n}", timeout=40
                )
            except ControlError as exc:
                results[n] = exc

        threads = [threading.Thread(target=caller, args=(n,)) for n in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert sorted(results) == list(range(20))
        for n, result in results.items():
            assert isinstance(result, dict), result
            assert result["duplicate"] is False
            assert result["text"] == "echo: " + big_text(n)
        assert_healthy_after_the_load(home, pid)
    assert sorted(keys_in_log(home, "s")) == sorted(f"k{n}" for n in range(20))


@pytest.mark.timeout(110)
def test_50_callers_that_close_at_once_leave_the_session_answering(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home, *ONE_EPOCH):
        call(str(home), "create", session="s")
        pid = status(home, "s")["pid"]
        callers: list[socket.socket] = []
        try:
            for n in range(50):
                sock = open_control(str(home), 40)
                callers.append(sock)
                sock.sendall(encode({"id": 1, "op": "send", "session": "s",
                                     "text": big_text(n), "key": f"k{n}"}))  # fmt: skip
        finally:
            for sock in callers:  # all at once, none reading its reply
                sock.close()
        assert_healthy_after_the_load(home, pid)
        # Each retry by key is answered: applied now, or from the log if it was before.
        with Client(str(home), timeout=60) as client:
            replies = client.send_many(
                "s", [Request(text=big_text(n), key=f"k{n}") for n in range(50)]
            )
        assert [r["key"] for r in replies] == [f"k{n}" for n in range(50)]
    assert sorted(keys_in_log(home, "s")) == sorted(f"k{n}" for n in range(50))


def test_a_relayed_reply_that_just_fits_is_answered_as_applied_under_a_long_id(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--app", "tests.apps.edge_apps:BigReplyApp"):
        call(str(home), "create", session="s")
        size = _reply_text_that_just_fits()
        fits = call(str(home), "send", session="s", text=f"reply {size}", key="fits")
        assert isinstance(fits, dict)
        assert len(fits["text"]) == size  # whole: under the daemon's short id it fits
        long_id = "c" * MAX_REQUEST_ID
        request: Message = {"id": long_id, "op": "send", "session": "s",
                            "text": f"reply {size}", "key": "long-id"}  # fmt: skip
        first, again = (_relay(home, request) for _ in range(2))
        assert first["id"] == long_id
        assert first["ok"] is True, first.get("error")  # never too_large: it was applied
        assert first["result"]["duplicate"] is False
        assert first["result"]["omitted"] == ["text"]
        assert again["result"]["duplicate"] is True  # the retry applies nothing
    assert keys_in_log(home, "s") == ["fits", "long-id"]


def _relay(home: Path, request: Message) -> dict[str, Any]:
    sock = open_control(str(home), 30)
    try:
        replies, _fds = exchange(sock, encode(request), 1, time.monotonic() + 30)
    finally:
        sock.close()
    reply: dict[str, Any] = replies[0]
    return reply


def _reply_text_that_just_fits() -> int:
    """A text size whose reply from the worker fits a frame under the daemon's int id,
    with less room to spare than a 256-character id takes."""
    widest = 2**31  # every number at its widest encoding
    app = "tests.apps.edge_apps:BigReplyApp"
    state = {"pid": widest, "session": "s", "epoch": widest, "records": widest, "slot": 0,
             "schedules": [0, None], "app": app, "app_version": app_version(app)}  # fmt: skip
    result = {"duplicate": False, "key": "long-id", "epoch": widest, "call": widest,
              "text": "", "context_tokens": widest, "committed": False, "group": widest,
              "state": state}  # fmt: skip
    overhead = len(encode({"id": widest, "ok": True, "result": result}))
    size = MAX_FRAME - overhead - 4  # the text's own header grows by 4 bytes (str32)
    return size
