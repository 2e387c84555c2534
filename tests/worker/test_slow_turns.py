"""Slow turns as an agent App has them: never taken for hangs, still caught when stuck.

Every test runs a real ``loopd serve`` with an App from tests/apps/slow_apps.py whose turns
take seconds, and talks to it through the real ``Client``.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from supervisor.client import Client, Request, call
from supervisor.errors import ControlError
from tests.harness.support import (
    log_user_keys,
    poll_until,
    running_daemon,
    status,
    stop,
    wait_state,
)


def _app(name: str, seconds: float) -> tuple[list[str], dict[str, str]]:
    return ["--app", f"tests.apps.slow_apps:{name}"], {"LOOPD_TEST_TURN_SECONDS": str(seconds)}


@pytest.mark.timeout(120)
def test_two_overlapping_six_second_turns_under_a_ten_second_hang_timeout_are_both_applied(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    args, env = _app("SlowTurnApp", 6)
    replies: dict[str, dict[str, object]] = {}
    with running_daemon(home, *args, "--hang-timeout", "10", env=env):
        call(str(home), "create", session="s")
        wait_state(home, "s", "RUNNING")

        def turn(key: str) -> None:
            with Client(str(home), timeout=60, retry_for=0) as client:
                replies[key] = client.send("s", f"turn {key}", key=key)

        threads = [threading.Thread(target=turn, args=(key,)) for key in ("a", "b")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=90)
        row = status(home, "s")
    assert sorted(replies) == ["a", "b"]
    assert all(reply["duplicate"] is False for reply in replies.values())
    assert row["restarts"] == 0, row["last_error"]
    assert sorted(str(k) for k in log_user_keys(home, "s")) == ["a", "b"]


@pytest.mark.timeout(150)
def test_a_turn_that_calls_progress_every_second_for_22_s_under_a_10_s_hang_timeout_is_applied(
    tmp_path: Path,
) -> None:
    """Over twice the hang timeout and four times the request deadline: only the App's
    progress keeps the turn alive (it was 40 s; 22 s proves the same, in half the time)."""
    home = tmp_path / "home"
    args, env = _app("ProgressApp", 22)
    with running_daemon(home, *args, "--hang-timeout", "10", "--request-deadline", "5", env=env):
        call(str(home), "create", session="s")
        with Client(str(home), timeout=90, retry_for=0) as client:
            reply = client.send("s", "a long tool loop", key="long")
        row = status(home, "s")
    assert reply["duplicate"] is False
    assert row["restarts"] == 0, row["last_error"]
    assert log_user_keys(home, "s") == ["long"]


@pytest.mark.timeout(120)
def test_four_pipelined_two_second_turns_of_a_handle_many_app_under_a_3_s_hang_timeout_apply(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    args, env = _app("SlowBatchApp", 1.8)
    with running_daemon(home, *args, "--hang-timeout", "3", env=env):
        call(str(home), "create", session="s")
        wait_state(home, "s", "RUNNING")
        with Client(str(home), timeout=60, retry_for=0) as client:
            replies = client.send_many("s", [Request(text=f"t{n}", key=f"k{n}") for n in range(4)])
        row = status(home, "s")
    assert [reply["key"] for reply in replies] == ["k0", "k1", "k2", "k3"]
    assert row["restarts"] == 0, row["last_error"]
    assert log_user_keys(home, "s") == ["k0", "k1", "k2", "k3"]


@pytest.mark.timeout(120)
def test_a_worker_sigstopped_mid_turn_is_still_killed_as_hung_and_replaced(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    args, env = _app("ProgressApp", 20)
    with running_daemon(home, *args, "--hang-timeout", "3", env=env):
        call(str(home), "create", session="s")
        first = wait_state(home, "s", "RUNNING")
        pid = int(str(first["pid"]))
        caught: list[ControlError] = []

        def turn() -> None:
            try:
                with Client(str(home), timeout=60, retry_for=0) as client:
                    client.send("s", "a turn that will be frozen", key="frozen")
            except ControlError as exc:
                caught.append(exc)

        thread = threading.Thread(target=turn)
        thread.start()
        poll_until((home / f"turn-{pid}").exists, what="the turn to start")
        stop(pid)

        def replaced_row() -> dict[str, object] | None:
            row = status(home, "s")
            return row if row["pid"] not in (None, pid) and row["state"] == "RUNNING" else None

        replaced = poll_until(replaced_row, timeout=30, what="the stopped worker to be replaced")
        thread.join(timeout=60)
    assert replaced["restarts"] == 1
    assert "hang: no heartbeat" in str(replaced["last_error"])
    assert "1 request(s) in flight" in str(replaced["last_error"])
    assert caught
    assert caught[0].code == "worker_died"


@pytest.mark.timeout(120)
def test_a_poison_request_is_refused_after_three_deaths_and_the_session_serves_the_others(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    args, env = _app("PoisonApp", 0)
    with running_daemon(home, *args, "--poison-after", "3", env=env):
        call(str(home), "create", session="s")
        wait_state(home, "s", "RUNNING")
        with Client(str(home), timeout=30, retry_for=30) as client:
            with pytest.raises(ControlError, match="poison request") as refused:
                client.send("s", "poison", key="bad")
            assert refused.value.code == "poison_request"
            good = client.send("s", "an ordinary request", key="good")
        row = status(home, "s")
    assert good["duplicate"] is False
    assert row["restarts"] == 3
    assert row["state"] == "RUNNING"
    assert "reached 3 deaths" in str(row["last_error"])
    assert log_user_keys(home, "s") == ["good"]


@pytest.mark.timeout(60)
def test_streamed_partials_arrive_before_the_reply_and_in_order(tmp_path: Path) -> None:
    home = tmp_path / "home"
    args, env = _app("StreamingApp", 0)
    with running_daemon(home, *args, env=env):
        call(str(home), "create", session="s")
        with Client(str(home), timeout=30) as client:
            stream = client.stream("s", "one two three four", key="k")
            partials = []
            for partial in stream:
                assert stream.reply is None  # the reply comes after every partial
                partials.append(partial)
            plain = client.send("s", "no partials for a plain send", key="k2")
    assert partials == ["0:one", "1:two", "2:three", "3:four"]
    assert stream.reply is not None
    assert stream.reply["text"] == "echo: one two three four"
    assert plain["duplicate"] is False
    assert log_user_keys(home, "s") == ["k", "k2"]


@pytest.mark.timeout(60)
def test_a_worker_that_dies_mid_stream_is_retried_by_key_and_its_partials_start_again(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    args, env = _app("DyingStreamApp", 0)
    with running_daemon(home, *args, env=env):
        call(str(home), "create", session="s")
        with Client(str(home), timeout=30) as client:
            stream = client.stream("s", "hello", key="k")
            partials = list(stream)
    assert partials == ["first", "second", "first", "second"]
    assert stream.restarts == 1
    assert stream.reply is not None
    assert stream.reply["duplicate"] is False
    assert log_user_keys(home, "s") == ["k"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("text", ["raise", "reset"])
def test_an_app_that_raises_on_one_request_has_it_refused_as_poison_and_serves_the_others(
    tmp_path: Path, text: str
) -> None:
    home = tmp_path / "home"
    args, env = _app("RaisingApp", 0)
    with running_daemon(home, *args, "--poison-after", "2", env=env):
        call(str(home), "create", session="s")
        wait_state(home, "s", "RUNNING")
        with Client(str(home), timeout=30, retry_for=30) as client:
            with pytest.raises(ControlError, match="poison request"):
                client.send("s", text, key="bad")
            good = client.send("s", "an ordinary request", key="good")
        row = status(home, "s")
    assert good["duplicate"] is False
    assert row["state"] == "RUNNING"
    assert row["restarts"] == 2  # a crash each time, never taken for a clean stop
    assert log_user_keys(home, "s") == ["good"]


@pytest.mark.timeout(60)
def test_a_streaming_app_handles_requests_that_share_a_chunk(tmp_path: Path) -> None:
    home = tmp_path / "home"
    args, env = _app("StreamingApp", 0)
    with running_daemon(home, *args, env=env):
        call(str(home), "create", session="s")
        with Client(str(home), timeout=30) as client:
            client.send("s", "warm up", key="w")  # the chunks grow past one
            replies = client.send_many(
                "s", [Request(text=f"a b {n}", key=f"k{n}") for n in range(8)]
            )
        row = status(home, "s")
    assert [r["outcome"] for r in replies] == ["applied"] * 8
    assert row["restarts"] == 0, row["last_error"]


@pytest.mark.timeout(60)
def test_an_abandoned_stream_and_a_huge_partial_leave_the_connection_usable(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    args, env = _app("HugePartialApp", 0)
    with running_daemon(home, *args, env=env):
        call(str(home), "create", session="s")
        with Client(str(home), timeout=30) as client:
            stream = client.stream("s", "one", key="k1")
            pieces = list(stream)
            assert sum(len(p) for p in pieces) == 1_500_000
            assert stream.reply is not None
            for _partial in client.stream("s", "two", key="k2"):
                break  # abandoned after its first partial
            after = client.send("s", "three", key="k3")
    assert after["key"] == "k3"
    assert after["text"] == "echo: three"
    assert log_user_keys(home, "s") == ["k1", "k2", "k3"]
