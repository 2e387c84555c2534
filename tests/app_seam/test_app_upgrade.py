"""App versions on a real ``loopd serve``: status, a mid-epoch resume, ``loopd upgrade``.

The App is a module written to a temporary folder and named in loopd.toml; its
``version`` is rewritten between worker starts, as a deploy does.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from supervisor.client import call
from supervisor.client.control import call_with_retry
from supervisor.errors import ControlError
from tests.harness.support import (
    log_user_keys,
    loopd,
    poll_until,
    running_daemon,
    status,
    wait_state,
)

APP = '''
from worker.app import DefaultApp

version = {version!r}


class VersionedApp(DefaultApp):
    """The echo App; its module says which version it is."""
'''
TARGET = "vapp:VersionedApp"


def _home(tmp_path: Path, version: str) -> tuple[Path, Path]:
    source, home = tmp_path / "src", tmp_path / "home"
    source.mkdir()
    home.mkdir()
    _deploy(source, version)
    (home / "loopd.toml").write_text(f'[apps.ver]\napp = "{TARGET}"\npath = [{str(source)!r}]\n')
    return home, source


def _deploy(source: Path, version: str, body: str = APP) -> None:
    # Each version string has its own length: a .pyc is trusted by source size and mtime.
    (source / "vapp.py").write_text(body.format(version=version))


def _versions(home: Path) -> dict[str, object]:
    found = call(str(home), "app_versions", timeout=60)
    assert isinstance(found, dict)
    return found


def _records(home: Path, session: str, epoch: int) -> list[dict[str, object]]:
    log = home / "sessions" / session / f"{epoch}.jsonl"
    return [json.loads(line) for line in log.read_bytes().splitlines()]


def _send_until(home: Path, stop: threading.Event, acked: list[str], session: str) -> None:
    """Keyed requests to ``session`` until ``stop``; each acknowledged key into ``acked``."""
    number = 0
    while not stop.is_set():
        key = f"{session}-load-{number}"
        number += 1
        try:
            call_with_retry(str(home), "send", session=session, text=key, key=key, deadline=_soon())
        except ControlError:
            continue  # never acknowledged: it may or may not be in the log, once at most
        acked.append(key)


def _soon() -> float:
    return time.monotonic() + 60.0


@pytest.mark.timeout(300)
def test_status_counts_the_older_sessions_and_upgrade_moves_them_without_dropping_a_request(
    tmp_path: Path,
) -> None:
    home, source = _home(tmp_path, "1")
    with running_daemon(home) as daemon:
        for session in ("s1", "s2"):
            assert loopd("create", "--home", str(home), session, "--app", "ver").returncode == 0
            call(str(home), "send", session=session, text="hello", key=f"{session}-first")
        row = status(home, "s1")
        assert (row["app"], row["app_version"]) == (TARGET, "1")
        assert _versions(home)["older"] == 0
        shown = loopd("status", "--home", str(home))
        assert "run an older App version" not in shown.stdout  # none is: nothing said

        _deploy(source, "2.0")
        found = _versions(home)
        assert found["older"] == 2
        rows = found["sessions"]
        assert isinstance(rows, list)
        assert {r["current"] for r in rows} == {"2.0"}
        assert "2 of 2 session(s)" in loopd("status", "--home", str(home)).stdout

        # A restart resumes s1 mid-epoch under 2.0: AppChanged in its log, and an event.
        call(str(home), "restart", session="s1", timeout=60)
        changed = [r for r in _records(home, "s1", 0) if r["type"] == "AppChanged"]
        assert [(r["from_version"], r["to_version"]) for r in changed] == [("1", "2.0")]
        poll_until(
            lambda: (
                "app vapp:VersionedApp version 1 -> 2.0 mid-epoch 0"
                in daemon.log_path.read_text(errors="replace")
            ),
            what="the AppChanged event in the supervisor's log",
        )
        assert status(home, "s1")["app_version"] == "1"  # as of its epoch, still 1

        stop = threading.Event()
        acked: dict[str, list[str]] = {"s1": [], "s2": []}
        senders = [
            threading.Thread(target=_send_until, args=(home, stop, acked[s], s)) for s in acked
        ]
        for sender in senders:
            sender.start()
        poll_until(lambda: all(len(keys) >= 3 for keys in acked.values()), what="load")
        upgraded = loopd("upgrade", "--home", str(home), "--rolling", "1", "--app", "ver")
        count = {s: len(keys) for s, keys in acked.items()}
        poll_until(lambda: all(len(acked[s]) >= count[s] + 3 for s in acked), what="load after")
        stop.set()
        for sender in senders:
            sender.join(timeout=120)
        assert upgraded.returncode == 0, upgraded.stderr
        lines = upgraded.stdout.splitlines()
        assert [line.split(":")[0] for line in lines if line.startswith("upgraded  ")] == [
            "upgraded  s1",
            "upgraded  s2",
        ]
        assert "upgraded  s2: version 1 -> 2.0, now in epoch 1" in upgraded.stdout
        for session, keys in acked.items():
            logged = log_user_keys(home, session)
            assert all(logged.count(key) == 1 for key in keys), session
            epoch = status(home, session)["epoch"]
            start = _records(home, session, int(str(epoch)))[0]
            assert (start["app"], start["app_version"]) == (TARGET, "2.0")
        assert _versions(home)["older"] == 0
        again = loopd("upgrade", "--home", str(home))
        assert again.returncode == 0
        assert "upgraded 0 session(s); failed 0" in again.stdout


@pytest.mark.timeout(180)
def test_upgrade_to_an_app_that_no_longer_imports_fails_in_one_line_per_session(
    tmp_path: Path,
) -> None:
    home, source = _home(tmp_path, "1")
    with running_daemon(home):
        for session in ("s1", "s2"):
            assert loopd("create", "--home", str(home), session, "--app", "ver").returncode == 0
        _deploy(source, "3", APP + "\nraise RuntimeError('half deployed')\n")
        upgraded = loopd("upgrade", "--home", str(home), "--app", "ver")
        assert upgraded.returncode == 1
        assert upgraded.stderr.splitlines() == [
            f"loopd upgrade: {s}: {TARGET} does not import: RuntimeError: half deployed"
            for s in ("s1", "s2")
        ]
        assert "Traceback" not in upgraded.stdout + upgraded.stderr
        assert status(home, "s1")["app_version"] == "1"
        unknown = loopd("upgrade", "--home", str(home), "--app", "nope")
        assert unknown.returncode == 1
        assert unknown.stderr.splitlines() == [
            f"loopd upgrade: --app nope: no session of {home} runs it (a name of loopd.toml's "
            "[apps], or serve's --app as module:attribute)"
        ]


@pytest.mark.timeout(240)
def test_a_rolling_upgrade_stops_at_a_session_that_fails_and_leaves_the_rest_serving(
    tmp_path: Path,
) -> None:
    """A version that imports but whose workers cannot start (its factory fails without a
    setting) once took every session down, one after the other."""
    home, source = _home(tmp_path, "1")
    sessions = ("s1", "s2", "s3")
    with running_daemon(home, "--start-retries", "1"):
        for session in sessions:
            assert loopd("create", "--home", str(home), session, "--app", "ver").returncode == 0
        broken = APP + "    def __init__(self):\n        raise RuntimeError('DB_URL is not set')\n"
        _deploy(source, "4", broken)
        upgraded = loopd("upgrade", "--home", str(home), "--app", "ver", "--rolling", "1")
        assert upgraded.returncode == 1
        assert "FAILED    s1" in upgraded.stdout, upgraded.stdout
        assert "stopped after a failure: 2 session(s) not begun" in upgraded.stdout
        for session in sessions[1:]:
            row = status(home, session)
            assert (row["state"], row["app_version"]) == ("RUNNING", "1"), row


def test_a_session_whose_log_names_no_app_is_not_counted_as_older(tmp_path: Path) -> None:
    """A session directory whose log holds no SessionStart (a create a full disk cut
    short): its App is unknown, not older, and status does not advise `loopd upgrade`."""
    home, _source = _home(tmp_path, "1")
    (home / "sessions" / "cut").mkdir(parents=True)
    (home / "sessions" / "cut" / "0.jsonl").write_bytes(b"")
    with running_daemon(home):
        wait_state(home, "cut", "FATAL")  # its log is refused
        found = _versions(home)
        assert found["older"] == 0, found
        shown = loopd("status", "--home", str(home))
        assert "run an older App version" not in shown.stdout
