"""The daemon's side jobs never block its loop: files it reads and writes, its own output,
sd_notify, events followers and metrics scrapers; and its status and logs at any size.

Every test runs a real ``loopd serve`` and talks to it through its sockets.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.client import call
from supervisor.control_socket import SOCKET_NAME
from supervisor.hosting.session_log import SessionLog, log_path
from tests.harness.support import (
    REPO,
    one_line,
    poll_until,
    running_daemon,
    serve_refused,
    status,
    wait_state,
)
from worker import Session
from worker.app import DefaultApp

STAMP = rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z "
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, named in the module from Python 3.10 on Linux only


# -- files the daemon reads and writes ---------------------------------------------------


def test_a_fifo_planted_as_a_session_log_is_refused_and_the_loop_keeps_answering(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home) as daemon:
        call(str(home), "create", session="s")
        call(str(home), "stop", session="s")
        log = home / "logs" / "s.log"
        log.unlink()
        os.mkfifo(log)  # opening it for writing would wait for a reader for ever
        # The worker's start is noted in its log: the start must answer all the same.
        call(str(home), "start", session="s", timeout=10)
        assert status(home, "s")["state"] == "RUNNING"
        assert call(str(home), "ping", timeout=5)
        said = poll_until(
            lambda: re.search(r"session s: cannot write its log: .*not a regular file but a "
                              r"FIFO", daemon.log_path.read_text()),
            what="the refused log to be reported",
        )  # fmt: skip
        assert said
        assert daemon.log_path.read_text().count("cannot write its log") == 1  # said once


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("intent.json", None, r"intent\.json: cannot read: not a regular file but a FIFO"),
        ("loopd.toml", None, r"loopd\.toml: cannot read: not a regular file but a FIFO"),
        ("intent.json", b"[" * 100_000 + b"]" * 100_000, r"intent\.json: .*nested too deeply"),
        ("intent.json", b"\xff\xfe\x00\x00garbage", r"intent\.json: not UTF-8: byte 0xff at "
         r"offset 0"),
        ("loopd.toml", b"a = " + b"[" * 100_000 + b"]" * 100_000, r"loopd\.toml: .*nested too "
         r"deeply"),
        ("loopd.toml", b"idle-stop = 3\n\xff\xfe\x00", r"loopd\.toml: not UTF-8: byte 0xff at "
         r"offset 14"),
    ],
    ids=["intent-fifo", "config-fifo", "intent-deep", "intent-garbage", "config-deep",
         "config-garbage"],
)  # fmt: skip
def test_serve_refuses_an_unreadable_intent_or_config_file_in_one_line_without_waiting(
    tmp_path: Path, name: str, content: bytes | None, said: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    if content is None:
        os.mkfifo(home / name)
    else:
        (home / name).write_bytes(content)
    served = serve_refused(home)
    assert served.returncode == 1
    assert re.search(said, one_line(served.stderr)), served.stderr
    assert not (home / SOCKET_NAME).exists()


# -- the daemon's own output -------------------------------------------------------------


def test_a_daemon_whose_stderr_is_not_read_keeps_serving_and_counts_the_lines_it_dropped(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    args = _crash_loop(home, 2)  # some 6 KB of event lines a crash, continuously
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "serve", "--home", str(home), *args],
        stdout=write_end, stderr=write_end, cwd=REPO,
    )  # fmt: skip
    os.close(write_end)
    try:
        poll_until((home / SOCKET_NAME).exists, what="the socket")
        # Nobody reads: 150 crashes are some 900 KB of lines, past the pipe and the queue.
        poll_until(lambda: _restarts(home, "c0") >= 150, timeout=60, what="150 crashes")
        assert call(str(home), "ping", timeout=5)
        os.set_blocking(read_end, False)
        seen = b""

        def dropped_said() -> bool:
            nonlocal seen
            with contextlib.suppress(BlockingIOError):
                while chunk := os.read(read_end, 65536):
                    seen += chunk
            return b"lines dropped" in seen

        poll_until(dropped_said, what="the count of dropped lines")
        count = re.search(rb"loopd serve: (\d+) lines dropped", seen)
        assert count is not None
        assert int(count.group(1)) > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        drain_until = time.monotonic() + 30
        os.set_blocking(read_end, False)
        while proc.poll() is None and time.monotonic() < drain_until:
            with contextlib.suppress(BlockingIOError):
                os.read(read_end, 65536)
            select.select([read_end], [], [], 0.1)
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        os.close(read_end)
    assert code == 0


def _restarts(home: Path, session: str) -> int:
    count = status(home, session)["restarts"]
    assert isinstance(count, int)
    return count


# -- log rotation and following ------------------------------------------------------------


def test_a_rotation_renames_only_the_full_log_and_older_backups_keep_their_names(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    args = ("--app", "tests.apps.hosting_apps:ChattyApp", "--log-max-bytes", "1024",
            "--log-backups", "1000")  # fmt: skip
    logs = home / "logs"

    def backups() -> dict[str, int]:
        return {p.name: p.stat().st_ino for p in logs.iterdir() if p.name != "s.log"}

    with running_daemon(home, *args):
        call(str(home), "create", session="s")
        for n in range(20):
            call(str(home), "send", session="s", text=f"line {n:02d} " + "x" * 40)
        poll_until(lambda: len(backups()) >= 2, what="two rotations")
        before = backups()
        for n in range(20, 40):
            call(str(home), "send", session="s", text=f"line {n:02d} " + "x" * 40)
        poll_until(lambda: len(backups()) > len(before), what="more rotations")
        after = backups()
    # O(1) a rotation: a backup is never renamed, whatever --log-backups is.
    assert {name: after.get(name) for name in before} == before
    numbers = sorted(int(name.rpartition(".")[2]) for name in after)
    assert numbers == list(range(1, len(numbers) + 1))


def test_loopd_logs_follow_reads_every_rotated_file_still_on_disk(tmp_path: Path) -> None:
    path = log_path(str(tmp_path), "s")
    writer = SessionLog(path, max_bytes=1024, backups=500)
    writer.feed(b"before\n")
    follower = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "logs", "--home", str(tmp_path), "s", "-n", "0",
         "-f"],
        stdout=subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    assert follower.stdout is not None
    got = b""
    try:
        deadline = time.monotonic() + 30
        while b"ready" not in got and time.monotonic() < deadline:  # until it follows
            writer.feed(b"ready\n")
            if select.select([follower.stdout], [], [], 0.3)[0]:
                got += os.read(follower.stdout.fileno(), 65536)
        assert b"ready" in got
        # 150 lines of 60 bytes: some 9 rotations, faster than the follower looks.
        writer.feed(b"".join(b"line %03d %s\n" % (n, b"y" * 24) for n in range(150)))
        while b"line 149" not in got and time.monotonic() < deadline:
            if select.select([follower.stdout], [], [], 0.5)[0]:
                got += os.read(follower.stdout.fileno(), 65536)
    finally:
        follower.terminate()
        follower.wait(timeout=10)
        follower.stdout.close()
        writer.close()
    shown = [re.sub(STAMP, b"", line) for line in got.splitlines() if b"line " in line]
    assert shown == [b"line %03d %s" % (n, b"y" * 24) for n in range(150)]


# -- sd_notify -------------------------------------------------------------------------------


@pytest.mark.parametrize("address", ["stream-socket", "path-under-a-file", "path-over-108-bytes"])
def test_a_notify_socket_that_cannot_work_is_reported_once_and_restarts_and_sigterm_work(
    tmp_path: Path, address: str
) -> None:
    home = tmp_path / "home"
    listener = None
    if address == "stream-socket":
        target = str(tmp_path / "notify.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(target)
        listener.listen(8)
    elif address == "path-under-a-file":
        (tmp_path / "file").write_text("")
        target = str(tmp_path / "file" / "notify.sock")
    else:
        target = str(tmp_path / ("n" * 120))
    try:
        with running_daemon(home, env={"NOTIFY_SOCKET": target}) as daemon:
            call(str(home), "create", session="s")
            first = status(home, "s")["pid"]
            call(str(home), "restart", session="s", timeout=10)
            row = wait_state(home, "s", "RUNNING")
            assert row["pid"] != first
            daemon.proc.send_signal(signal.SIGTERM)
            assert daemon.proc.wait(timeout=20) == 0
        out = daemon.log_path.read_text()
        assert out.count("notifications to the service manager are off") == 1, out
        assert "Traceback" not in out
    finally:
        if listener is not None:
            listener.close()


# -- events followers ------------------------------------------------------------------------


def _crash_loop(home: Path, sessions: int) -> tuple[str, ...]:
    """Sessions whose workers crash at once, again and again: each crash's event carries a
    last error of some 6 KB, so 1 MiB of events takes some 200 crashes."""
    app = DefaultApp()
    for n in range(sessions):
        Session.create(home, f"c{n}", app.initial_baseline(f"c{n}")).close()
    return ("--app", "tests.apps.side_job_apps:loud_crash_app", "--max-restarts", "1000000",
            "--start-retries", "1000000", "--backoff-base", "0", "--backoff-max", "0")  # fmt: skip
