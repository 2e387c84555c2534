"""The supervisor with real workers: restarts, in-flight errors, FATAL, locks, shutdown."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import msgpack
import psutil
import pytest

from supervisor.client import call
from supervisor.control_socket import SOCKET_NAME
from supervisor.errors import ControlError
from tests.conftest import torn_session
from tests.harness.support import Daemon, loopd, poll_until, running_daemon, status, wait_state
from worker import Session, User
from worker.app import DefaultApp

BLOCKING = ("--app", "tests.apps:BlockingApp")


def _users(home: Path, session: str) -> list[User]:
    """Every User record of every epoch, read back from the files."""
    users = []
    directory = home / "sessions" / session
    for log in sorted(directory.glob("*.jsonl"), key=lambda p: int(p.name.split(".")[0])):
        for line in log.read_bytes().splitlines():
            record = json.loads(line)
            if record["type"] == "User":
                users.append(
                    User(
                        time=record["time"],
                        text=record["text"],
                        untrusted=record["untrusted"],
                        key=record["key"],
                    )
                )
    return users


@pytest.mark.parametrize("method", ["fork", "exec"])
def test_a_sigkilled_worker_is_restarted_and_resumes_with_every_acknowledged_record(
    tmp_path: Path, method: str
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--start-method", method) as daemon:
        call(str(home), "create", session="s1", slot=3)
        acknowledged = [f"k{n}" for n in range(5)]
        for key in acknowledged:
            call(str(home), "send", session="s1", text=f"text {key}", key=key)
        before = wait_state(home, "s1", "RUNNING")
        assert before["restarts"] == 0
        old_pid = before["pid"]
        assert isinstance(old_pid, int)
        os.kill(old_pid, signal.SIGKILL)

        def restarted() -> dict[str, object] | None:
            row = status(home, "s1")
            return row if row["state"] == "RUNNING" and row["pid"] != old_pid else None

        after = poll_until(restarted, what="the restarted worker")
        assert after["restarts"] == 1
        assert "SIGKILL" in str(after["last_error"])
        assert after["records"] == 1 + 4 * len(acknowledged)
        reply = call(str(home), "send", session="s1", text="after", key="k-after")
        assert isinstance(reply, dict)
        assert reply["call"] == len(acknowledged) + 1  # next_call resumed, never reused
        assert daemon.stop() == 0
    assert [u.key for u in _users(home, "s1")] == [*acknowledged, "k-after"]


@pytest.mark.parametrize("when", ["block-after", "block-before"])
def test_a_request_in_flight_when_the_worker_dies_gets_an_error_and_its_retry_applies_once(
    tmp_path: Path, when: str
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, *BLOCKING):
        call(str(home), "create", session="s1")
        outcome: dict[str, object] = {}

        def send() -> None:
            try:
                outcome["result"] = call(str(home), "send", session="s1", text=when, key="once")
            except ControlError as exc:
                outcome["error"] = exc

        sender = threading.Thread(target=send)
        sender.start()
        marker = poll_until(
            lambda: next(iter(home.glob("blocked-*")), None), what="the worker to hold the request"
        )
        os.kill(int(marker.name.split("-")[1]), signal.SIGKILL)
        sender.join(timeout=30)
        assert not sender.is_alive()
        failure = outcome.get("error")
        assert isinstance(failure, ControlError)
        assert failure.code == "worker_died"
        assert "retry with the same key" in failure.message
        retry = call(str(home), "send", session="s1", text=when, key="once")
        assert isinstance(retry, dict)
        assert retry["duplicate"] is (when == "block-after")
    assert [u.key for u in _users(home, "s1")] == ["once"]


def test_a_worker_on_a_torn_log_goes_fatal_once_with_path_line_and_the_next_step(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    log = torn_session(home, "torn")
    with running_daemon(home) as daemon:
        row = wait_state(home, "torn", "FATAL")
        assert row["restarts"] == 0
        assert f"{log}:2: last line has no newline" in str(row["last_error"])
        assert "loopd repair" in str(row["last_error"])
        assert row["pid"] is None
        # No crash loop: no worker is running for it, and it stays FATAL.
        assert daemon.workers() == []
        assert status(home, "torn")["state"] == "FATAL"
        with pytest.raises(ControlError, match="FATAL"):
            call(str(home), "send", session="torn", text="x")


def test_a_worker_that_always_crashes_at_start_goes_fatal_after_the_limit_with_backoff(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    Session.create(home, "bad", DefaultApp().initial_baseline("bad")).close()
    crash_log = tmp_path / "starts"
    args = (
        "--app",
        "tests.apps:crashing_app",
        "--max-restarts",
        "3",
        "--restart-window",
        "60",
        "--backoff-base",
        "0.05",
    )
    with running_daemon(home, *args, env={"LOOPD_TEST_CRASH_LOG": str(crash_log)}):
        row = wait_state(home, "bad", "FATAL")
        assert row["restarts"] == 3
        assert "more than 3 restarts in 60 s" in str(row["last_error"])
        assert "always crashes" in str(row["last_error"])
    starts = [float(t) for t in crash_log.read_text().split()]
    assert len(starts) == 4  # the first start and three restarts
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # Immediate first restart, then 0.05 s, then 0.1 s at least (plus jitter).
    assert gaps[1] >= 0.05
    assert gaps[2] >= 0.1


def test_a_second_serve_on_the_same_home_exits_non_zero_naming_the_holder(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home) as daemon:
        second = loopd("serve", "--home", str(home))
        assert second.returncode != 0
        assert f"pid {daemon.proc.pid}" in second.stderr


def test_a_second_worker_for_a_live_session_gets_lock_held(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home):
        call(str(home), "create", session="s1")
        holder = status(home, "s1")["pid"]
        ours, theirs = socket.socketpair()
        try:
            proc = psutil.Popen(
                [
                    sys.executable,  # the venv's interpreter; exe() resolves to the base one
                    "-m",
                    "worker",
                    "--home",
                    str(home),
                    "--session",
                    "s1",
                    "--channel-fd",
                    str(theirs.fileno()),
                ],
                pass_fds=(theirs.fileno(),),
            )
            theirs.close()
            assert proc.wait(timeout=30) == 3
            said = msgpack.unpackb(ours.recv(65536), raw=False)
        finally:
            ours.close()
        assert said["code"] == "locked"
        assert said["holder"] == holder


def test_a_sigkilled_supervisor_leaves_no_worker_running(tmp_path: Path) -> None:
    home = tmp_path / "home"
    daemon = Daemon(home)
    try:
        for name in ("a", "b", "c"):
            call(str(home), "create", session=name)
        workers = daemon.workers()
        assert len(workers) == 3
        daemon.proc.kill()
        daemon.proc.wait(timeout=10)
        _gone, alive = psutil.wait_procs(workers, timeout=10)
        assert alive == []
    finally:
        daemon.stop()


def test_sigterm_to_the_supervisor_stops_every_worker_and_exits_0(tmp_path: Path) -> None:
    home = tmp_path / "home"
    daemon = Daemon(home)
    for name in ("a", "b"):
        call(str(home), "create", session=name)
    workers = daemon.workers()
    assert len(workers) == 2
    assert daemon.stop() == 0
    _gone, alive = psutil.wait_procs(workers, timeout=1)
    assert alive == []
    assert not (home / SOCKET_NAME).exists()


def _raw(home: Path, payload: bytes) -> object:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(home / SOCKET_NAME))
        # The daemon may answer an oversized frame and close before reading all of it.
        with contextlib.suppress(BrokenPipeError):
            sock.sendall(payload)
        data = sock.recv(65536)
    return msgpack.unpackb(data, raw=False) if data else None


def test_the_control_socket_is_0600_and_bad_frames_leave_the_daemon_serving(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home):
        mode = stat.S_IMODE(os.stat(home / SOCKET_NAME).st_mode)
        assert mode == 0o600
        garbage = _raw(home, b"\xc1\xc1\xc1 not msgpack")
        assert isinstance(garbage, dict)
        assert garbage["error"]["code"] == "bad_frame"
        oversized = _raw(home, msgpack.packb({"id": 1, "op": "send", "text": "x" * (2 << 20)}))
        assert isinstance(oversized, dict)
        assert "size limit" in oversized["error"]["message"]
        not_a_map = _raw(home, msgpack.packb([1, 2, 3]))
        assert isinstance(not_a_map, dict)
        assert not_a_map["ok"] is False
        ill_typed = _raw(home, msgpack.packb({"id": 7, "op": "send", "session": 5, "text": 1}))
        assert ill_typed == {
            "id": 7,
            "ok": False,
            "error": {"code": "bad_request", "message": "field 'session' must be str, got int"},
        }
        unknown = _raw(home, msgpack.packb({"id": 8, "op": "explode"}))
        assert isinstance(unknown, dict)
        assert unknown["error"]["code"] == "bad_request"
        bad_id = _raw(home, msgpack.packb({"id": 9, "op": "send", "session": "../x", "text": "t"}))
        assert isinstance(bad_id, dict)
        assert "invalid session id" in bad_id["error"]["message"]
        assert call(str(home), "ping")


def test_status_json_lists_every_session_with_the_documented_keys(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home):
        call(str(home), "create", session="b")
        call(str(home), "create", session="a")
        call(str(home), "send", session="a", text="hi")
        shown = loopd("status", "--home", str(home), "--json")
        assert shown.returncode == 0, shown.stderr
        rows = json.loads(shown.stdout)
        assert [r["session"] for r in rows] == ["a", "b"]
        for row in rows:
            assert set(row) >= {
                "session",
                "state",
                "pid",
                "epoch",
                "records",
                "restarts",
                "uptime_s",
                "rss_bytes",
                "last_error",
            }
            assert row["state"] == "RUNNING"
            assert isinstance(row["pid"], int)
            assert row["rss_bytes"] > 0
            assert row["cpu_s"] >= 0
        assert rows[0]["records"] == 5
        table = loopd("status", "--home", str(home))
        assert table.stdout.splitlines()[0].split()[:3] == ["session", "state", "pid"]


def test_stop_start_and_restart_move_the_session_through_its_states(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home):
        call(str(home), "create", session="s1")
        first = status(home, "s1")["pid"]
        assert psutil.Process(int(str(first))).name() == "loopd:s1"  # what ps and pgrep show
        stopped = call(str(home), "stop", session="s1")
        assert isinstance(stopped, dict)
        assert stopped["state"] == "STOPPED"
        assert (
            not psutil.pid_exists(int(str(first)))
            or psutil.Process(int(str(first))).status() == psutil.STATUS_ZOMBIE
        )
        with pytest.raises(ControlError, match="STOPPED"):
            call(str(home), "send", session="s1", text="x")
        started = call(str(home), "start", session="s1")
        assert isinstance(started, dict)
        assert started["state"] == "RUNNING"
        restarted = call(str(home), "restart", session="s1")
        assert isinstance(restarted, dict)
        assert restarted["state"] == "RUNNING"
        assert restarted["pid"] not in (first, started["pid"])
        compacted = call(str(home), "compact", session="s1", summary="by hand")
        assert isinstance(compacted, dict)
        assert compacted["state"]["epoch"] == 1
    with Session.open(home, "s1") as session:
        assert session.carry == "by hand"


PEER = """
import os, socket, sys
import msgpack  # before dropping root: the interpreter's files may be root's alone
os.setgid(65534)
os.setuid(65534)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(10)
sock.connect(sys.argv[1])
try:
    sock.sendall(msgpack.packb({"id": 1, "op": "ping"}))
    data = sock.recv(65536)
except OSError:
    data = b""
print("closed" if not data else "answered")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another uid")
def test_a_peer_of_another_uid_is_refused_even_when_the_socket_mode_would_let_it_in(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home):
        path = home / SOCKET_NAME
        # Open the way past the file modes on purpose, so only SO_PEERCRED stands guard;
        # the modes are put back afterwards.
        opened = [home, *[p for p in (tmp_path, *tmp_path.parents) if p != Path("/")]]
        modes = {p: stat.S_IMODE(os.stat(p).st_mode) for p in opened}
        try:
            os.chmod(path, 0o666)  # noqa: S103 - the point of the test
            for directory in opened:
                os.chmod(directory, modes[directory] | 0o001)
            peer = subprocess.run(
                [sys.executable, "-c", PEER, str(path)],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        finally:
            for directory, mode in modes.items():
                os.chmod(directory, mode)
        assert peer.stdout.strip() == "closed", peer.stderr
        assert call(str(home), "ping")


def test_a_session_held_by_another_process_goes_fatal_naming_the_holder_without_a_fight(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    Session.create(home, "held", DefaultApp().initial_baseline("held")).close()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys\nfrom worker import Session\ns = Session.open(sys.argv[1], 'held')\n"
         "print('holding', flush=True)\nsys.stdin.read()", str(home)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"holding\n"
        with running_daemon(home) as daemon:
            row = wait_state(home, "held", "FATAL")
            assert f"locked by process {holder.pid}" in str(row["last_error"])
            assert "not fighting it" in str(row["last_error"])
            assert row["restarts"] == 0
            assert daemon.workers() == []
            assert holder.poll() is None  # the holder was left alone
    finally:
        holder.kill()
        holder.wait()
        for stream in (holder.stdin, holder.stdout):
            if stream is not None:
                stream.close()
