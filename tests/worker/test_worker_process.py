"""The worker process on its own: ready, requests, keys, budget, resume, exit codes."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgpack
import pytest

from tests.conftest import HUGE_LINE, torn_session
from tests.harness.forge import reseal
from tests.harness.support import REPO
from worker import Session
from worker.app import DefaultApp
from worker.ipc.wire import Channel, Message
from worker.process import (
    EXIT_CANNOT_OPEN,
    EXIT_CLEAN,
    EXIT_CRASH,
    EXIT_DISK_FULL,
    EXIT_LOCKED,
    EXIT_REFUSED,
    MAX_REPORT,
)
from worker.store.format.records import EpochEnd, encode_appended


class RunningWorker:
    def __init__(self, proc: subprocess.Popen[bytes], channel: Channel) -> None:
        self.proc = proc
        self.channel = channel
        self._id = 0

    def ask(self, op: str, **fields: object) -> Message:
        self._id += 1
        self.channel.send({"id": self._id, "op": op, **fields})
        reply = self.channel.recv()
        assert reply is not None
        assert reply["id"] == self._id
        return reply


@contextmanager
def worker(home: Path, session: str, *args: str) -> Iterator[RunningWorker]:
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "worker",
            "--home",
            str(home),
            "--session",
            session,
            "--channel-fd",
            str(theirs.fileno()),
            *args,
        ],
        pass_fds=(theirs.fileno(),),
        cwd=REPO,
        stderr=subprocess.PIPE,
    )
    theirs.close()
    try:
        yield RunningWorker(proc, Channel(ours))
    finally:
        ours.close()
        try:
            proc.wait(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()


def _request(w: RunningWorker, text: str, key: str | None = None) -> dict[str, object]:
    reply = w.ask("request", request={"text": text, "key": key})
    assert reply["ok"] is True, reply
    result = reply["result"]
    assert isinstance(result, dict)
    return result


def test_a_worker_creates_signals_ready_serves_and_exits_0_when_its_channel_closes(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with worker(home, "s1", "--create", "--slot", "4") as w:
        ready = w.channel.recv()
        assert ready is not None
        assert (ready["op"], ready["epoch"], ready["records"], ready["slot"]) == ("ready", 0, 1, 4)
        first = _request(w, "hello", "k1")
        assert (first["call"], first["text"], first["duplicate"]) == (1, "echo: hello", False)
        again = _request(w, "hello", "k1")
        assert again["duplicate"] is True
        assert (again["epoch"], again["line"]) == (0, 2)
        w.channel.close()
        assert w.proc.wait(timeout=20) == EXIT_CLEAN
    lines = (home / "sessions" / "s1" / "0.jsonl").read_bytes().splitlines()
    assert [json.loads(x)["type"] for x in lines] == [
        "SessionStart",
        "User",
        "ToolResult",
        "Assistant",
        "Usage",
    ]


def test_the_default_app_commits_an_epoch_when_the_context_passes_the_budget(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with worker(home, "s1", "--create", "--budget", "30") as w:
        assert w.channel.recv() is not None
        committed = [_request(w, "x" * 80, f"k{n}")["committed"] for n in range(3)]
        assert committed == [True, True, True]
        status = w.ask("status")["result"]
        assert isinstance(status, dict)
        assert status["state"]["epoch"] == 3
        w.ask("stop")
        assert w.proc.wait(timeout=20) == EXIT_CLEAN
    with Session.open(home, "s1") as session:
        assert session.carry is not None
        assert session.carry.startswith("epoch 2: 1 requests")
        assert session.baseline.memory == session.carry
        # Every epoch's keys are found, the oldest as the newest.
        assert [
            (ref.epoch, ref.line) for k in ("k0", "k1", "k2") if (ref := session.find_key(k))
        ] == [
            (0, 2),
            (1, 2),
            (2, 2),
        ]


def _log_keys(home: Path, session: str = "s1") -> list[str]:
    return [
        key
        for log in sorted((home / "sessions" / session).glob("*.jsonl"))
        for line in log.read_bytes().splitlines()
        if (key := json.loads(line).get("key"))
    ]


def test_a_retry_of_a_key_from_any_epoch_is_answered_from_the_log_and_a_new_key_applied(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with worker(home, "s1", "--create", "--budget", "30") as w:
        assert w.channel.recv() is not None
        for n in range(3):  # each request passes the budget: epochs 1, 2, 3
            assert _request(w, "x" * 80, f"k{n}")["committed"] is True

        def send(key: str, epoch: int) -> Message:
            # "epoch": the newest epoch an older client had seen; it no longer matters.
            reply = w.ask("request", request={"text": "x" * 80, "key": key, "epoch": epoch})
            assert reply["ok"] is True, reply
            result = reply["result"]
            assert isinstance(result, dict)
            return result

        old = send("k0", 0)  # applied in epoch 0, three epoch changes ago
        assert (old["duplicate"], old["epoch"], old["line"]) == (True, 0, 2)
        new = send("fresh", 0)  # a new key from a client that last saw epoch 0
        assert (new["duplicate"], new["epoch"]) == (False, 3)
        w.ask("stop")
        assert w.proc.wait(timeout=20) == EXIT_CLEAN
    with worker(home, "s1") as w:  # a new process: nothing of the old one in memory
        assert w.channel.recv() is not None
        for key, epoch in (("k0", 0), ("k1", 1), ("fresh", 3)):
            again = _request(w, "x" * 80, key)
            assert (again["duplicate"], again["epoch"]) == (True, epoch)
        w.ask("stop")
        assert w.proc.wait(timeout=20) == EXIT_CLEAN
    assert _log_keys(home) == ["k0", "k1", "k2", "fresh"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("recent_keys", "{}"), ("next_call", 1)],
    ids=["recent-keys-emptied", "next-call-lowered"],
)
def test_a_worker_refuses_carried_state_that_verify_refuses_and_exits_4_with_path_line(
    tmp_path: Path, field: str, value: object
) -> None:
    home = tmp_path / "home"
    with worker(home, "s1", "--create", "--budget", "30") as w:
        assert w.channel.recv() is not None
        for n in range(2):  # epochs 1 and 2; k1, with call 2, is in epoch 1
            assert _request(w, "x" * 80, f"k{n}")["committed"] is True
        w.ask("stop")
        assert w.proc.wait(timeout=20) == EXIT_CLEAN
    log = home / "sessions" / "s1" / "2.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    start = json.loads(lines[0])
    start[field] = value
    lines[0] = json.dumps(start, separators=(",", ":")).encode() + b"\n"
    log.write_bytes(b"".join(lines))
    reseal(log.parent)  # a deliberate change: the checksums are made to match
    with worker(home, "s1") as w:
        said = w.channel.recv()
        assert said is not None
        if said.get("op") == "ready":  # served: show what it does with the crafted state
            w.ask("request", request={"text": "x", "key": "k1"})
            w.ask("stop")
        assert w.proc.wait(timeout=20) == EXIT_REFUSED, _log_keys(home)
        assert w.proc.stderr is not None
        stderr = w.proc.stderr.read().decode().strip()
    assert stderr.startswith(f"{log}:1: SessionStart's carried state hashes to"), stderr
    assert said["code"] == "refused"
    verified = subprocess.run(
        [sys.executable, "-m", "supervisor", "verify", "--home", str(home)],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert verified.returncode == 1
    assert f"{log}:1:" in verified.stdout


def test_sigterm_stops_a_worker_with_exit_code_0(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with worker(home, "s1", "--create") as w:
        assert w.channel.recv() is not None
        w.proc.send_signal(signal.SIGTERM)
        assert w.proc.wait(timeout=20) == EXIT_CLEAN


def test_a_worker_on_a_torn_log_exits_with_the_refused_code_and_prints_path_line(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    log = torn_session(home, "s1")
    with worker(home, "s1") as w:
        said = w.channel.recv()
        assert w.proc.wait(timeout=20) == EXIT_REFUSED
        assert w.proc.stderr is not None
        assert w.proc.stderr.read().decode().strip() == (
            f"{log}:2: last line has no newline (torn write)"
        )
    assert said is not None
    assert said["code"] == "refused"


def test_a_worker_for_a_locked_session_exits_with_the_lock_code(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with Session.create(home, "s1", DefaultApp().initial_baseline("s1")), worker(home, "s1") as w:
        said = w.channel.recv()
        assert w.proc.wait(timeout=20) == EXIT_LOCKED
    assert said is not None
    assert said["code"] == "locked"


@pytest.mark.parametrize("leftover", ["nothing", "next-baseline"])
def test_a_worker_resumes_an_interrupted_epoch_change_without_a_second_epoch_end(
    tmp_path: Path, leftover: str
) -> None:
    home = tmp_path / "home"
    app = DefaultApp()
    with Session.create(home, "s1", app.initial_baseline("s1")) as session:
        directory = Path(session.dir)
    with (directory / "0.jsonl").open("ab") as f:
        f.write(
            encode_appended(
                (directory / "0.jsonl").read_bytes(), EpochEnd(next=1, summary="the recorded one")
            )
        )
    if leftover == "next-baseline":
        (directory / "1.baseline.json").write_bytes(b'{"partial":')
    with worker(home, "s1") as w:
        ready = w.channel.recv()
        assert ready is not None
        assert ready["epoch"] == 1
        w.ask("stop")
        assert w.proc.wait(timeout=20) == EXIT_CLEAN
    types = [json.loads(x)["type"] for x in (directory / "0.jsonl").read_bytes().splitlines()]
    assert types.count("EpochEnd") == 1
    with Session.open(home, "s1") as session:
        assert (session.epoch, session.carry) == (1, "the recorded one")
        assert session.baseline.memory == "the recorded one"


def test_a_bad_frame_gets_an_error_reply_and_the_worker_keeps_serving(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with worker(home, "s1", "--create") as w:
        assert w.channel.recv() is not None
        for garbage in (b"\xc1\xc1 not msgpack", msgpack.packb([1, 2, 3])):
            w.channel.sock.sendall(garbage)
            reply = w.channel.recv()
            assert reply is not None
            assert reply["ok"] is False
            failure = reply["error"]
            assert isinstance(failure, dict)
            assert failure["code"] == "bad_frame"
        typed = w.ask("request", request={"text": 5})
        assert typed["ok"] is False
        assert typed["error"] == {
            "code": "bad_request",
            "message": "protocol error: field 'text' must be str, got int",
        }
        assert _request(w, "still here", "k1")["text"] == "echo: still here"
        w.ask("stop")
        assert w.proc.wait(timeout=20) == EXIT_CLEAN


def _unopenable(home: Path, damage: str) -> tuple[Path, str, tuple[str, ...]]:
    """A session that fails to open the same way every time: the path named, the errno
    name, and the worker's extra arguments."""
    app = DefaultApp()
    with Session.create(home, "s1", app.initial_baseline("s1")) as session:
        directory = Path(session.dir)
    if damage == "enospc-while-resuming":
        with (directory / "0.jsonl").open("ab") as f:
            f.write(
                encode_appended((directory / "0.jsonl").read_bytes(), EpochEnd(next=1, summary="s"))
            )
        return directory, "ENOSPC", ("--app", "tests.apps:no_space_for_epoch_1_app")
    # Open cannot make what it read durable: a restart meets the same failing disk.
    return directory, "EIO", ("--app", "tests.apps:eio_syncing_the_session_directory_app")


@pytest.mark.parametrize(
    ("damage", "code", "said_code", "prefix"),
    [
        ("eio-syncing-at-open", EXIT_CANNOT_OPEN, "cannot_open", "cannot open: "),
        # A full disk is an outage, not the session's fault: exit 9, started again.
        ("enospc-while-resuming", EXIT_DISK_FULL, "disk_full", ""),
    ],
)
def test_a_worker_that_cannot_open_its_session_exits_and_says_where_and_why(
    tmp_path: Path, damage: str, code: int, said_code: str, prefix: str
) -> None:
    home = tmp_path / "home"
    path, errno_name, args = _unopenable(home, damage)
    with worker(home, "s1", *args) as w:
        said = w.channel.recv()
        assert w.proc.wait(timeout=20) == code
        assert w.proc.stderr is not None
        printed = w.proc.stderr.read().decode()
    assert said is not None
    assert (said["op"], said["code"]) == ("exiting", said_code)
    message = said["message"]
    assert isinstance(message, str)
    assert message.startswith(f"{path}")
    assert f"[{errno_name}]" in message
    assert printed == f"{prefix}{message}\n"


def test_a_worker_whose_session_breaks_while_serving_still_exits_as_a_crash(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    Session.create(home, "s1", DefaultApp().initial_baseline("s1")).close()
    with worker(home, "s1", "--app", "tests.apps:failing_log_fsync_app") as w:
        ready = w.channel.recv()
        assert ready is not None
        assert ready["op"] == "ready"
        failed = w.ask("request", request={"text": "hello", "key": "k1"})
        assert failed["ok"] is False
        said = w.channel.recv()
        # Broken by a failed fsync: exit as a crash, to be restarted and reopen from disk.
        assert w.proc.wait(timeout=20) == EXIT_CRASH
    assert said is not None
    assert said["code"] == "crash"


def test_a_worker_refusing_a_line_that_quotes_a_huge_value_exits_4_with_a_bounded_report(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    Session.create(home, "s1", DefaultApp().initial_baseline("s1")).close()
    log = home / "sessions" / "s1" / "0.jsonl"
    with log.open("ab") as f:
        f.write(HUGE_LINE)
    with worker(home, "s1") as w:
        said = w.channel.recv()
        assert w.proc.wait(timeout=20) == EXIT_REFUSED
        assert w.proc.stderr is not None
        printed = w.proc.stderr.read().decode()
    assert said is not None
    assert said["code"] == "refused"
    message = said["message"]
    assert isinstance(message, str)
    assert message.startswith(f"{log}:2: ")
    assert len(message) <= MAX_REPORT
    assert printed == f"{message}\n"
