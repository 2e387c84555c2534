"""Production hosting through a real ``loopd serve``: intent, systemd, configuration,
logs, events, metrics, hibernation and memory caps."""

from __future__ import annotations

import json
import os
import random
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import psutil

from supervisor.client import Client, call
from tests.harness.promtext import MetricFamily, parse
from tests.harness.support import Daemon, loopd, poll_until, running_daemon, status, wait_state
from worker import Session, User
from worker.app import DefaultApp

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z "


def _make_sessions(home: Path, *names: str) -> None:
    app = DefaultApp()
    for name in names:
        Session.create(home, name, app.initial_baseline(name)).close()


def test_a_stop_is_remembered_across_a_supervisor_sigkill_and_restart(tmp_path: Path) -> None:
    home = tmp_path / "home"
    daemon = Daemon(home)
    try:
        assert loopd("create", "--home", str(home), "a").returncode == 0
        assert loopd("create", "--home", str(home), "b").returncode == 0
        assert loopd("stop", "--home", str(home), "a").returncode == 0
        workers = daemon.workers()
        daemon.proc.kill()  # no chance to write anything at exit
        daemon.proc.wait(timeout=20)
        psutil.wait_procs(workers, timeout=20)  # each sees its channel close and exits
    finally:
        daemon.stop()
    assert json.loads((home / "intent.json").read_text()) == {"stopped": ["a"]}
    with running_daemon(home):
        wait_state(home, "b", "RUNNING")
        assert status(home, "a")["state"] == "STOPPED"
        assert loopd("start", "--home", str(home), "a").returncode == 0
        wait_state(home, "a", "RUNNING")
    with running_daemon(home):  # a start is remembered too
        wait_state(home, "a", "RUNNING")
    assert not any(name.startswith("intent") for name in os.listdir(home / "sessions" / "a"))


def test_serve_tells_systemd_ready_status_watchdog_and_stopping(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _make_sessions(home, "a", "b")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
        manager.bind(str(tmp_path / "notify.sock"))
        manager.settimeout(20)
        env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "200000"}
        daemon = Daemon(home, env=env)
        try:
            ready = manager.recv(4096).decode()
            while ready == "WATCHDOG=1\n":  # the watchdog may ping before READY under load
                ready = manager.recv(4096).decode()
            assert ready.startswith("READY=1\nSTATUS=2 sessions")
            assert status(home, "a")["state"] in ("STARTING", "RUNNING")  # started, not waited
            got = [manager.recv(4096).decode() for _ in range(3)]
            assert "WATCHDOG=1\n" in got  # every 0.1 s: half of WATCHDOG_USEC
        finally:
            daemon.proc.send_signal(signal.SIGTERM)
            seen = ""
            while "STOPPING=1" not in seen:
                seen = manager.recv(4096).decode()
            code = daemon.proc.wait(timeout=30)  # one SIGTERM: a second may find no handler
            daemon.stop()
        assert code == 0
        assert seen == "STOPPING=1\nSTATUS=stopping every worker\n"


def test_print_config_shows_the_file_under_the_flags_and_unknown_keys_are_refused(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "loopd.toml").write_text('max-live = 500\nidle-stop = 30\nstart-method = "exec"\n')
    shown = loopd("serve", "--home", str(home), "--max-live", "7", "--print-config")
    assert shown.returncode == 0, shown.stderr
    assert "max-live = 7\n" in shown.stdout
    assert "idle-stop = 30.0\n" in shown.stdout
    assert 'start-method = "exec"\n' in shown.stdout
    assert "max-restarts = 5\n" in shown.stdout  # a default
    (home / "loopd.toml").write_text("max_live = 3\n")
    refused = loopd("serve", "--home", str(home))
    assert refused.returncode == 1
    assert re.search(r"loopd\.toml: unknown key 'max_live'", refused.stderr)
    assert not (home / "loopd.sock").exists()


def test_worker_output_goes_to_its_log_stamped_and_rotated_at_the_byte_limit(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    args = ("--app", "tests.apps.hosting_apps:ChattyApp", "--log-max-bytes", "1024",
            "--log-backups", "2")  # fmt: skip
    with running_daemon(home, *args), Client(str(home)) as client:
        client.call("create", session="s")
        for n in range(60):
            client.send("s", f"line {n:02d}", key=f"k{n}")
        logs = home / "logs"
        poll_until(lambda: b"err: line 59" in (logs / "s.log").read_bytes(), what="the log")
        shown = loopd("logs", "--home", str(home), "s", "-n", "2")
    names = sorted(os.listdir(logs), key=lambda name: int(name.partition(".log.")[2] or 0))
    assert len(names) == 3
    assert names[0] == "s.log"  # and the two newest backups, numbered up as they rotate
    assert int(names[2].rpartition(".")[2]) == int(names[1].rpartition(".")[2]) + 1
    pattern = STAMP + r"((out|err): line \d\d|\[loopd\] worker \d+ (started|exited with code 0))$"
    for name in os.listdir(logs):
        text = (logs / name).read_text()
        assert len(text.encode()) <= 1024
        assert all(re.match(pattern, line) for line in text.splitlines()), text
    assert [re.sub(STAMP, "", line) for line in shown.stdout.splitlines()] == [
        "out: line 59", "err: line 59",
    ]  # fmt: skip


def test_an_events_follower_sees_a_session_hibernate_and_wake(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--idle-stop", "0.5") as daemon:
        follower = subprocess.Popen(
            [sys.executable, "-m", "supervisor", "events", "--home", str(home), "--json"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            poll_until(lambda: _followers(home) == 1, what="the follower to subscribe")
            assert loopd("create", "--home", str(home), "s").returncode == 0
            wait_state(home, "s", "IDLE")
            assert loopd("send", "--home", str(home), "s", "hi", "--key", "k").returncode == 0
            events = _read_events(follower, 8)
            # Hibernated: no worker process, and no file of the session open in the daemon.
            assert daemon.workers() == []
            held = [f.path for f in psutil.Process(daemon.proc.pid).open_files()]
            assert not [path for path in held if "/logs/" in path or "/sessions/" in path]
        finally:
            follower.terminate()
            follower.communicate(timeout=20)
    moves = [(e["from"], e["to"]) for e in events if e["session"] == "s"]
    assert moves == [
        ("STOPPED", "STARTING"), ("STARTING", "RUNNING"), ("RUNNING", "STOPPING"),
        ("STOPPING", "IDLE"), ("IDLE", "STARTING"), ("STARTING", "RUNNING"),
        ("RUNNING", "STOPPING"), ("STOPPING", "IDLE"),
    ]  # fmt: skip
    assert events[2]["reason"] == "no request for 0.5 s"
    hibernated = events[3]
    assert hibernated["exit_code"] == 0
    assert hibernated["pid"] == events[2]["pid"]
    assert events[4]["reason"] == "woken by a request"
    assert "event: " in Path(f"{home}.serve.log").read_text()  # the supervisor's own log


def test_hibernation_and_wake_under_load_lose_and_double_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    sessions = [f"s{n}" for n in range(4)]
    with running_daemon(home, "--idle-stop", "0.2", "--max-live", "2") as daemon:
        for name in sessions:
            call(str(home), "create", session=name)
        errors: list[BaseException] = []

        def load(seed: int) -> None:
            rng = random.Random(seed)
            try:
                with Client(str(home), retry_for=60) as client:
                    for n in range(15):
                        session = rng.choice(sessions)
                        client.send(session, f"{seed}-{n}", key=f"{seed}-{n}")
                        if rng.random() < 0.2:
                            threading.Event().wait(0.3)  # long enough to hibernate
            except BaseException as exc:  # noqa: BLE001 - reported by the test below
                errors.append(exc)

        threads = [threading.Thread(target=load, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=100)
        assert not errors, errors
        families = parse(loopd("metrics", "--home", str(home)).stdout)
        assert families["loopd_hibernations_total"].value() > 0
        assert families["loopd_wakeups_total"].value() > 0
        assert len(daemon.workers()) <= 2
    keys = []
    for name in sessions:
        with Session.open(home, name) as session:
            keys += [str(r.key) for r in session.records if isinstance(r, User)]
    assert sorted(keys) == sorted(f"{seed}-{n}" for seed in range(4) for n in range(15))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _scrape(port: int) -> dict[str, MetricFamily]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return parse(answer.read().decode())


def test_metrics_follow_the_format_and_their_counters_move(tmp_path: Path) -> None:
    home = tmp_path / "home"
    port = _free_port()
    with running_daemon(home, "--metrics-listen", f"127.0.0.1:{port}"):
        call(str(home), "create", session="s")
        before = parse(loopd("metrics", "--home", str(home)).stdout)
        with Client(str(home)) as client:
            for n in range(5):
                client.send("s", f"r{n}", key=f"k{n}")
        call(str(home), "compact", session="s")

        def moved() -> dict[str, MetricFamily] | None:
            after = _scrape(port)
            done = after["loopd_requests_total"].value() >= 5
            return after if done and after["loopd_epoch_changes_total"].value() >= 1 else None

        after = poll_until(moved, what="the workers' counters to reach the supervisor")
    assert before["loopd_requests_total"].value() == 0
    assert before["loopd_sessions"].value(state="RUNNING") == 1
    fsync = after["loopd_fsync_seconds"]
    latency = after["loopd_request_seconds"]
    appended = after["loopd_appended_bytes_total"]
    assert fsync.total("_count") >= 5
    assert latency.total("_count") == 5
    assert appended.value() > before["loopd_appended_bytes_total"].value()
    assert after["loopd_epoch_changes_total"].value() == 1
    assert after["loopd_live_workers"].value() == 1
    # By App, never by session: the default App's five requests and its Usage tokens.
    assert after["loopd_app_requests_total"].value(app="default") == 5
    assert after["loopd_app_tokens_total"].value(app="default", kind="prompt") > 0
    assert after["loopd_tokens_total"].value(kind="prompt") > 0


def test_a_worker_that_grows_past_max_rss_is_restarted_with_the_reason(tmp_path: Path) -> None:
    home = tmp_path / "home"
    args = ("--app", "tests.apps.hosting_apps:AllocatingApp", "--max-rss", "120")
    with running_daemon(home, *args), Client(str(home)) as client:
        client.call("create", session="s")
        first = status(home, "s")["pid"]
        client.send("s", "grow 200", key="grow")
        row = poll_until(lambda: _restarted(status(home, "s")), what="the restart past --max-rss")
        assert row["pid"] != first
        assert "past --max-rss 120 MiB: restarted" in str(row["last_error"])
        assert client.send("s", "grow 200", key="grow")["duplicate"] is True  # applied once
        families = parse(loopd("metrics", "--home", str(home)).stdout)
        assert families["loopd_memory_restarts_total"].value() == 1


def _restarted(row: dict[str, object]) -> dict[str, object] | None:
    return row if row["restarts"] == 1 and row["state"] == "RUNNING" else None


def _read_events(follower: subprocess.Popen[str], count: int) -> list[dict[str, object]]:
    """The first ``count`` events a follower prints, waiting for each up to a deadline.

    Read from the pipe's fd, not the text wrapper: a readline() may leave the next lines
    in the wrapper's buffer, where select() cannot see them.
    """
    assert follower.stdout is not None
    fd = follower.stdout.fileno()
    pending = b""
    events: list[dict[str, object]] = []
    while len(events) < count:
        if b"\n" not in pending:
            ready, _, _ = select.select([fd], [], [], 20)
            assert ready, f"no event after {events}"
            chunk = os.read(fd, 65536)
            assert chunk, f"the follower ended after {events}"
            pending += chunk
            continue
        line, pending = pending.split(b"\n", 1)
        events.append(json.loads(line))
    return events


def _followers(home: Path) -> object:
    answer = call(str(home), "ping")
    return answer.get("event_followers") if isinstance(answer, dict) else None
