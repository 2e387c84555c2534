"""The direct data path: Client to worker without the daemon, group commit, retry by key."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from functools import partial
from pathlib import Path
from typing import cast

import msgpack
import psutil
import pytest

from supervisor.client import Client, Request, call
from supervisor.errors import ControlError
from tests.harness.support import (
    log_user_keys,
    loopd,
    poll_until,
    running_daemon,
    status,
    stop,
    wait_state,
)
from worker import Session
from worker.ipc.wire import MAX_FRAME


def test_requests_reach_the_worker_while_the_daemon_itself_is_stopped(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home) as daemon, Client(str(home), timeout=10) as client:
        call(str(home), "create", session="s1")
        assert client.send("s1", "first", key="k0")["call"] == 1
        stop(daemon.proc)  # the daemon's loop cannot relay anything
        try:
            replies = [client.send("s1", f"text {n}", key=f"k{n}") for n in range(1, 4)]
        finally:
            os.kill(daemon.proc.pid, signal.SIGCONT)
        assert [r["call"] for r in replies] == [2, 3, 4]
    assert log_user_keys(home, "s1") == ["k0", "k1", "k2", "k3"]


def test_pipelined_requests_share_group_commits_and_each_key_is_applied_once_in_order(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--budget", "100000000"), Client(str(home)) as client:
        call(str(home), "create", session="s1")
        requests = [Request(text=f"text {n}", key=f"p{n}") for n in range(300)]
        replies = client.send_many("s1", requests)
        assert [r["key"] for r in replies] == [f"p{n}" for n in range(300)]
        assert max(int(str(r["group"])) for r in replies) > 1  # several per fsync
        again = client.send_many("s1", requests[:5])
        assert all(r["duplicate"] for r in again)
    assert log_user_keys(home, "s1") == [f"p{n}" for n in range(300)]


def test_send_many_across_two_epoch_changes_applies_each_key_once_and_its_retry_is_answered(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--budget", "30"), Client(str(home)) as client:
        call(str(home), "create", session="s1")
        batch = [Request(text="x" * 80, key=f"b{n}") for n in range(8)]  # each commits
        outcomes = client.send_many("s1", batch)
        assert [o["outcome"] for o in outcomes] == ["applied"] * 8
        assert [o["epoch"] for o in outcomes] == list(range(8))
        again = client.send_many("s1", batch)  # the caller's retry of the whole batch
        assert [(o["outcome"], o["epoch"]) for o in again] == [("duplicate", n) for n in range(8)]
        with Client(str(home)) as other:  # another client, later: still a duplicate
            assert other.send("s1", "x" * 80, key="b0")["duplicate"] is True
    assert log_user_keys(home, "s1") == [f"b{n}" for n in range(8)]


def test_send_many_reports_each_outcome_and_keeps_the_applied_ones_when_one_is_refused(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--budget", "30"), Client(str(home)) as client:
        call(str(home), "create", session="s1")
        bad = Request(text=cast(str, 5), key="bad")  # the worker refuses a text that is no string
        batch = [Request(text="x" * 80, key="a1"), bad, Request(text="x" * 80, key="a2")]
        outcomes = client.send_many("s1", batch)
        assert [(o["outcome"], o["key"]) for o in outcomes] == [
            ("applied", "a1"), ("refused", "bad"), ("applied", "a2"),
        ]  # fmt: skip
        error = outcomes[1]["error"]
        assert isinstance(error, dict)
        assert "text" in str(error["message"])
        # The caller retries the batch with the refused one fixed: applied once each.
        retried = client.send_many("s1", [batch[0], Request(text="fixed", key="bad"), batch[2]])
        assert [o["outcome"] for o in retried] == ["duplicate", "applied", "duplicate"]
    assert log_user_keys(home, "s1") == ["a1", "a2", "bad"]


def test_a_cli_retry_from_a_new_process_after_two_epoch_changes_is_answered_as_a_duplicate(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--budget", "30"):
        call(str(home), "create", session="s1")

        def send(key: str) -> dict[str, object]:
            sent = loopd("send", "--home", str(home), "s1", "x" * 80, "--key", key)
            assert sent.returncode == 0, sent.stderr
            reply = json.loads(sent.stdout)
            assert isinstance(reply, dict)
            return reply

        assert send("K")["duplicate"] is False
        assert [send(f"other{n}")["epoch"] for n in range(2)] == [1, 2]  # two epoch changes
        retried = send("K")
        assert (retried["duplicate"], retried["epoch"], retried["line"]) == (True, 0, 2)
    assert log_user_keys(home, "s1") == ["K", "other0", "other1"]


def test_concurrent_clients_of_one_session_share_fsyncs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    groups: list[int] = []
    with running_daemon(home, "--budget", "100000000"):
        call(str(home), "create", session="s1")

        def drive(n: int) -> None:
            with Client(str(home)) as client:
                for m in range(40):
                    reply = client.send("s1", f"{n}-{m}", key=f"c{n}-{m}")
                    groups.append(int(str(reply["group"])))

        threads = [threading.Thread(target=drive, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert len(groups) == 8 * 40
    keys = log_user_keys(home, "s1")
    assert sorted(k for k in keys if k) == sorted(f"c{n}-{m}" for n in range(8) for m in range(40))


def test_a_client_reconnects_after_its_worker_is_sigkilled_and_retries_by_key(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--app", "tests.apps:BlockingApp") as daemon:
        call(str(home), "create", session="s1")
        outcome: dict[str, object] = {}

        def send() -> None:
            with Client(str(home)) as client:
                outcome["first"] = client.send("s1", "block-after", key="once")
                outcome["second"] = client.send("s1", "later", key="later")

        sender = threading.Thread(target=send)
        sender.start()
        marker = poll_until(
            lambda: next(iter(home.glob("blocked-*")), None), what="the worker to hold it"
        )
        os.kill(int(marker.name.split("-")[1]), signal.SIGKILL)
        sender.join(timeout=30)
        assert not sender.is_alive()
        first = outcome["first"]
        assert isinstance(first, dict)
        assert first["duplicate"] is True  # applied before the death, answered from the log
        assert isinstance(outcome["second"], dict)
        assert status(home, "s1")["restarts"] == 1
        assert daemon.proc.poll() is None
    assert log_user_keys(home, "s1") == ["once", "later"]


def test_a_client_waits_out_a_sigstopped_worker_and_is_answered_after_the_restart(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--hang-timeout", "1"), Client(str(home)) as client:
        call(str(home), "create", session="s1")
        client.send("s1", "before", key="before")
        pid = status(home, "s1")["pid"]
        assert isinstance(pid, int)
        stop(pid)
        reply = client.send("s1", "during", key="during")
        assert reply["duplicate"] is False
        row = status(home, "s1")
        assert row["pid"] != pid
        assert "hang: no heartbeat" in str(row["last_error"])
    assert log_user_keys(home, "s1") == ["before", "during"]


def test_a_request_past_the_deadline_kills_its_worker_and_the_retry_is_answered(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    args = ("--app", "tests.apps:SpinningApp", "--request-deadline", "0.5")
    with running_daemon(home, *args), Client(str(home)) as client:
        call(str(home), "create", session="s1")
        reply = client.send("s1", "spin", key="spin")
        assert reply["key"] == "spin"
        row = wait_state(home, "s1", "RUNNING", restarts=1)
        assert "request-deadline" in str(row["last_error"])
    assert log_user_keys(home, "s1") == ["spin"]


def test_a_reply_too_large_for_a_frame_is_answered_as_applied_without_its_text(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home), Client(str(home)) as client:
        call(str(home), "create", session="s1")
        text = "w" * (MAX_FRAME - 64)  # the request fits a frame; its echo does not
        reply = client.send("s1", text, key="big")
        assert reply["duplicate"] is False
        assert reply["omitted"] == ["text"]
        assert client.send("s1", text, key="big")["duplicate"] is True
    assert log_user_keys(home, "s1") == ["big"]


def test_a_compact_with_a_summary_near_the_frame_limit_is_answered_as_applied(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    summary = "s" * (MAX_FRAME - 200)
    with running_daemon(home):
        call(str(home), "create", session="s1")
        reply = call(str(home), "compact", session="s1", summary=summary)
        assert isinstance(reply, dict)
        assert reply["state"]["epoch"] == 1
    with Session.open(home, "s1") as session:
        assert session.carry == summary


def test_enospc_on_the_epoch_commit_answers_the_applied_request_as_applied(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    args = ("--app", "tests.apps:enospc_on_epoch_end_app", "--budget", "10")
    with running_daemon(home, *args), Client(str(home)) as client:
        call(str(home), "create", session="s1")
        reply = client.send("s1", "x" * 80, key="k1")
        assert reply["committed"] is False
        assert "No space left" in str(reply["commit_error"])
        assert client.send("s1", "x" * 80, key="k1")["duplicate"] is True
        assert client.send("s1", "y" * 80, key="k2")["committed"] is True
    assert log_user_keys(home, "s1") == ["k1", "k2"]


def test_loopd_send_goes_through_the_client_and_refuses_an_unknown_session_in_one_line(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home):
        call(str(home), "create", session="s1")
        sent = loopd("send", "--home", str(home), "s1", "hello", "--key", "cli")
        assert sent.returncode == 0, sent.stderr
        assert json.loads(sent.stdout)["key"] == "cli"
        missing = loopd("send", "--home", str(home), "nope", "hello")
        assert missing.returncode != 0
        assert missing.stderr.count("\n") == 1
        assert "not_found" in missing.stderr
    assert log_user_keys(home, "s1") == ["cli"]


def test_a_stopped_session_refuses_the_client_with_its_state(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home), Client(str(home)) as client:
        call(str(home), "create", session="s1")
        client.send("s1", "hi")
        call(str(home), "stop", session="s1")
        with pytest.raises(ControlError, match="STOPPED"):
            client.send("s1", "after the stop")


def test_a_client_gives_up_on_a_silent_worker_after_its_timeout_in_one_error(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--hang-timeout", "60"), Client(str(home), timeout=1) as client:
        call(str(home), "create", session="s1")
        client.send("s1", "before", key="before")
        pid = status(home, "s1")["pid"]
        assert isinstance(pid, int)
        stop(pid)
        try:
            with pytest.raises(ControlError, match="did not answer within 1 s"):
                client.send("s1", "during", key="during")
        finally:
            os.kill(pid, signal.SIGCONT)
        assert client.send("s1", "during", key="during")["key"] == "during"
    assert log_user_keys(home, "s1") == ["before", "during"]


def _is_zombie(pid: int) -> bool:
    return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)


def test_a_connection_asked_for_as_its_worker_dies_still_gets_exactly_one_reply(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home) as daemon:
        call(str(home), "create", session="s1")
        for round_no in range(3):
            row = wait_state(home, "s1", "RUNNING", restarts=round_no)
            pid = row["pid"]
            assert isinstance(pid, int)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(10)
            sock.connect(str(home / "loopd.sock"))
            try:
                sock.sendall(msgpack.packb({"id": 0, "op": "ping"}))
                assert msgpack.unpackb(sock.recv(65536), raw=False)["ok"]
                # With the daemon stopped, the request for a connection is queued before
                # the worker dies: the loop reads it before it reads the death.
                stop(daemon.proc)
                try:
                    sock.sendall(msgpack.packb({"id": 1, "op": "connect", "session": "s1"}))
                    os.kill(pid, signal.SIGKILL)
                    poll_until(partial(_is_zombie, pid), what="the worker to die")
                finally:
                    os.kill(daemon.proc.pid, signal.SIGCONT)
                data, fds, _flags, _addr = socket.recv_fds(sock, 65536, 4)
            finally:
                sock.close()
            for fd in fds:
                os.close(fd)
            reply = msgpack.unpackb(data, raw=False)
            assert reply["id"] == 1
            assert reply["ok"] is True or reply["error"]["code"] in ("busy", "worker_died")
