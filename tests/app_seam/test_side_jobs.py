"""The daemon's side jobs never block its loop: files it reads and writes, its own output,
sd_notify, events followers and metrics scrapers; and its status and logs at any size.

Every test runs a real ``loopd serve`` and talks to it through its sockets.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import resource
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from supervisor.client import call
from supervisor.control_socket import SOCKET_NAME
from supervisor.hosting.session_log import SessionLog, log_path
from tests.harness.promtext import parse
from tests.harness.support import REPO, loopd, poll_until, running_daemon, status, wait_state
from worker import Session
from worker.app import DefaultApp
from worker.ipc.wire import FrameReader, encode

STAMP = rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z "
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, named in the module from Python 3.10 on Linux only


def _serve(home: Path, *args: str, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
    """``loopd serve`` that is expected to refuse at once (killed after ``timeout``)."""
    return subprocess.run(
        [sys.executable, "-m", "supervisor", "serve", "--home", str(home), *args],
        capture_output=True, text=True, timeout=timeout, check=False, cwd=REPO,
    )  # fmt: skip


def _one_line(text: str) -> str:
    assert "Traceback" not in text, text
    assert len(text.strip().splitlines()) == 1, text
    return text.strip()


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
    served = _serve(home)
    assert served.returncode == 1
    assert re.search(said, _one_line(served.stderr)), served.stderr
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


def _follower(home: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel holds little
    sock.connect(str(home / SOCKET_NAME))
    sock.sendall(encode({"id": 1, "op": "events"}))
    return sock


def _followers(home: Path) -> int:
    pong = call(str(home), "ping")
    assert isinstance(pong, dict)
    count = pong["event_followers"]
    assert isinstance(count, int)
    return count


def _crash_loop(home: Path, sessions: int) -> tuple[str, ...]:
    """Sessions whose workers crash at once, again and again: each crash's event carries a
    last error of some 6 KB, so 1 MiB of events takes some 200 crashes."""
    app = DefaultApp()
    for n in range(sessions):
        Session.create(home, f"c{n}", app.initial_baseline(f"c{n}")).close()
    return ("--app", "tests.apps.side_job_apps:loud_crash_app", "--max-restarts", "1000000",
            "--start-retries", "1000000", "--backoff-base", "0", "--backoff-max", "0")  # fmt: skip


@pytest.mark.timeout(120)
def test_followers_that_never_read_are_dropped_and_the_daemon_memory_stays_bounded(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, *_crash_loop(home, 4)) as daemon:
        followers = [_follower(home) for _ in range(20)]
        try:
            poll_until(lambda: _followers(home) == 20, what="the followers to subscribe")
            peak = 0

            def all_dropped() -> bool:
                nonlocal peak
                peak = max(peak, psutil.Process(daemon.proc.pid).memory_info().rss)
                return _followers(home) == 0

            poll_until(all_dropped, timeout=90, what="every follower that does not read to "
                       "be dropped")  # fmt: skip
        finally:
            for sock in followers:
                sock.close()
        log = daemon.log_path.read_text()
    assert log.count("events follower dropped") == 20
    assert peak < 150 << 20  # 20 followers buffered up to 32 MiB each would be 640 MiB


def test_a_dropped_follower_that_reads_again_is_told_why_it_was_dropped(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, *_crash_loop(home, 2)):
        # ``loopd events`` whose stdout nobody reads stops reading its socket in turn.
        printer = subprocess.Popen(
            [sys.executable, "-m", "supervisor", "events", "--home", str(home)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
        )  # fmt: skip
        sock = _follower(home)
        try:
            with sock:
                poll_until(lambda: _followers(home) == 2, what="the followers to subscribe")
                poll_until(lambda: _followers(home) == 0, timeout=60, what="them to be dropped")
                reader = FrameReader()
                messages = []
                sock.settimeout(10)
                while data := sock.recv(1 << 16):  # what was sent, then the end of stream
                    messages += reader.feed(data)
            _out, err = printer.communicate(timeout=30)
        finally:
            if printer.poll() is None:
                printer.kill()
                printer.communicate()
    assert messages[0]["ok"] is True
    assert all("event" in m for m in messages[1:-1])
    assert "stopped streaming events to you" in str(messages[-1]["dropped"])
    assert printer.returncode == 1
    assert re.search(rb"^loopd events: the supervisor stopped streaming events to you",
                     err, re.MULTILINE), err  # fmt: skip


# -- metrics ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _scrape(port: int, token: str | None = None) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - http only
        return str(answer.read().decode())


def test_scrapes_read_workers_rss_from_a_cache_not_every_worker_each_time(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    port = _free_port()
    with running_daemon(home, "--metrics-listen", f"127.0.0.1:{port}"):
        for n in range(4):
            call(str(home), "create", session=f"s{n}")
        started = time.monotonic()
        for _ in range(60):
            families = parse(_scrape(port))
        elapsed = time.monotonic() - started
        poll_until(lambda: parse(_scrape(port))["loopd_workers_rss_bytes"].value() > 0,
                   what="the cache to be filled")  # fmt: skip
        families = parse(_scrape(port))
    assert families["loopd_live_workers"].value() == 4
    reads = families["loopd_rss_reads_total"].value()
    # Each worker is read once per 5 s at most (and once more at the first scrape), not 61
    # times: 244 reads before the cache.
    assert 4 <= reads <= 4 * (2 + (elapsed + 5) / 5), (reads, elapsed)


def test_a_metrics_token_file_refuses_scrapes_without_the_token(tmp_path: Path) -> None:
    home = tmp_path / "home"
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    token_file.chmod(0o600)
    port = _free_port()
    args = ("--metrics-listen", f"127.0.0.1:{port}", "--metrics-token-file", str(token_file))
    with running_daemon(home, *args):
        for token in (None, "wrong"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                _scrape(port, token)
            assert refused.value.code == 401
            refused.value.close()
        assert "loopd_sessions" in _scrape(port, "s3cret-token")
    token_file.chmod(0o644)
    served = _serve(home, *args)
    assert served.returncode == 1
    assert "lets others read the token" in _one_line(served.stderr)


def test_a_flood_of_idle_metrics_connections_leaves_the_control_socket_answering(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    port = _free_port()
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "serve", "--home", str(home), "--metrics-listen",
         f"127.0.0.1:{port}"],
        stdout=log, stderr=log, cwd=REPO,
    )  # fmt: skip
    resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (256, 256))
    flood: list[socket.socket] = []
    try:
        poll_until((home / SOCKET_NAME).exists, what="the socket")
        call(str(home), "create", session="s", timeout=10)
        for _ in range(400):  # more than the daemon's 256 descriptors, held open
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            flood.append(sock)
        # Every connection has reached the daemon's accept queue before it is asked.
        poll_until(lambda: _accepted(proc.pid, port) >= 16, what="the flood to be accepted")
        assert isinstance(call(str(home), "status", timeout=5), list)
        assert call(str(home), "send", session="s", text="still here", timeout=5)
    finally:
        for sock in flood:
            sock.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _accepted(pid: int, port: int) -> int:
    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return 0
    return sum(1 for c in connections if c.laddr and c.laddr.port == port and c.raddr)


# -- status at any size ----------------------------------------------------------------------


@pytest.fixture
def many_failed(tmp_path: Path) -> Iterator[Path]:
    """A daemon whose 220 sessions are FATAL, each with some 6 KB of last error (1.3 MB of
    status rows, past the 1 MiB frame: as 2,000 sessions with shorter errors)."""
    home = tmp_path / "home"
    app = DefaultApp()
    for n in range(220):
        Session.create(home, f"s{n:04d}", app.initial_baseline(f"s{n:04d}")).close()
    args = ("--app", "tests.apps.side_job_apps:loud_crash_app", "--max-restarts", "0")
    with running_daemon(home, *args):
        poll_until(
            lambda: all(r["state"] == "FATAL" for r in _every_row(home)), timeout=100,
            what="every session to be FATAL",
        )  # fmt: skip
        yield home


def _every_row(home: Path) -> list[dict[str, object]]:
    shown = loopd("status", "--home", str(home), "--json")
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)
    assert isinstance(rows, list)
    return rows


@pytest.mark.timeout(150)
def test_status_of_sessions_whose_rows_pass_a_frame_is_listed_whole_in_pages(
    many_failed: Path,
) -> None:
    home = many_failed
    rows = _every_row(home)
    assert [r["session"] for r in rows] == [f"s{n:04d}" for n in range(220)]
    assert all("€€€" in str(r["last_error"]) for r in rows)
    table = loopd("status", "--home", str(home))
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith("session ")  # the header, then every session
    assert [line.split()[0] for line in lines[1:221]] == [f"s{n:04d}" for n in range(220)]
    one = loopd("status", "--home", str(home), "s0107", "--json")
    assert one.returncode == 0, one.stderr
    assert [r["session"] for r in json.loads(one.stdout)] == ["s0107"]
