"""The daemon's side jobs under peers that misbehave: event followers, scrapers, status pages."""

from __future__ import annotations

import json
import re
import resource
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
from tests.harness.promtext import parse
from tests.harness.support import REPO, loopd, one_line, poll_until, running_daemon, serve_refused
from worker import Session
from worker.app import DefaultApp
from worker.ipc.wire import FrameReader, encode


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
    served = serve_refused(home, *args)
    assert served.returncode == 1
    assert "lets others read the token" in one_line(served.stderr)


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
