"""A retried turn keeps its answer; a session's records can be read live; sends stream."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from supervisor.client import Client, call
from tests.harness.support import REPO, loopd, poll_until, running_daemon, status, wait_state

ANSWER = ("text", "call", "context_tokens", "key", "epoch")


def _answer(reply: dict[str, object]) -> dict[str, object]:
    return {name: reply[name] for name in ANSWER}


def test_a_duplicate_reply_carries_the_same_answer_as_the_first_in_this_epoch_and_the_last(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--budget", "100000000"), Client(str(home)) as client:
        call(str(home), "create", session="s")
        first = client.send("s", "what did the agent say?", key="k1")
        again = client.send("s", "what did the agent say?", key="k1")
        call(str(home), "compact", session="s")
        after_commit = client.send("s", "what did the agent say?", key="k1")
    assert first["duplicate"] is False
    assert again["duplicate"] is True
    assert after_commit["duplicate"] is True
    assert first["text"] == "echo: what did the agent say?"
    assert _answer(again) == _answer(first)
    assert _answer(after_commit) == _answer(first)  # rebuilt from the sealed epoch's log


def test_a_request_applied_before_its_worker_died_is_answered_with_its_answer_on_retry(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    replies: list[dict[str, object]] = []
    with running_daemon(home, "--app", "tests.apps:BlockingApp"):
        call(str(home), "create", session="s")
        pid = int(str(wait_state(home, "s", "RUNNING")["pid"]))

        def send() -> None:
            with Client(str(home), timeout=30, retry_for=30) as client:
                replies.append(client.send("s", "block-after then die", key="lost"))

        thread = threading.Thread(target=send)
        thread.start()
        poll_until((home / f"blocked-{pid}").exists, what="the request to be applied")
        os.kill(pid, signal.SIGKILL)  # after the fsync, before the reply
        thread.join(timeout=60)
        row = status(home, "s")
    assert row["restarts"] == 1
    [reply] = replies
    assert reply["duplicate"] is True
    assert reply["text"] == "echo: block-after then die"
    assert reply["call"] == 1


def test_client_records_and_loopd_tail_show_the_records_the_worker_holds(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--budget", "100000000"), Client(str(home)) as client:
        call(str(home), "create", session="s")
        for n in range(3):
            client.send("s", f"request {n}", key=f"k{n}")
        page = client.records("s")
        later = client.records("s", since=int(str(page["next"])))
        printed = loopd("tail", "--home", str(home), "s", "-n", "5")
    records = page["records"]
    assert isinstance(records, list)
    request = ["User", "ToolResult", "Assistant", "Usage"]
    assert [r["type"] for r in records] == ["SessionStart", *request * 3]
    assert later["records"] == []
    assert page["lines"] == page["next"] == 13
    assert printed.returncode == 0, printed.stderr
    log = (home / "sessions" / "s" / "0.jsonl").read_bytes().splitlines()
    shown = [json.loads(line) for line in printed.stdout.splitlines()]
    written = [{k: v for k, v in json.loads(line).items() if k not in ("part", "parts", "crc")}
               for line in log[-5:]]  # fmt: skip
    assert shown == written


@pytest.mark.timeout(150)
def test_loopd_tail_follow_prints_records_as_they_become_durable_across_an_epoch_commit(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    out = tmp_path / "tail.out"
    with running_daemon(home, "--budget", "100000000"), Client(str(home)) as client:
        call(str(home), "create", session="s")
        with open(out, "wb") as sink:
            follower = subprocess.Popen(
                [sys.executable, "-m", "supervisor", "tail", "--home", str(home), "s", "-f"],
                cwd=REPO, stdout=sink, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            poll_until(
                lambda: b"SessionStart" in out.read_bytes(), timeout=60, what="the first record"
            )
            client.send("s", "before the commit", key="a")
            call(str(home), "compact", session="s")
            client.send("s", "after the commit", key="b")
            poll_until(
                lambda: b"after the commit" in out.read_bytes(), timeout=60, what="the new record"
            )
        finally:
            follower.send_signal(signal.SIGINT)
            follower.wait(timeout=30)
    printed = out.read_bytes().splitlines()
    types = [json.loads(line)["type"] for line in printed]
    request = ["User", "ToolResult", "Assistant", "Usage"]
    assert types == ["SessionStart", *request, "EpochEnd", "SessionStart", *request], printed


def test_loopd_send_stream_prints_the_partials_then_the_reply(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--app", "tests.apps.slow_apps:StreamingApp"):
        call(str(home), "create", session="s")
        sent = loopd("send", "--home", str(home), "s", "alpha beta", "--key", "k", "--stream")
    assert sent.returncode == 0, sent.stderr
    partials, reply = sent.stdout.splitlines()
    assert partials == "0:alpha1:beta"
    assert json.loads(reply)["text"] == "echo: alpha beta"
