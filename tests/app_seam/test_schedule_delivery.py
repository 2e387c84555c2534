"""Scheduled requests with a real supervisor: delivered once, never early, whatever dies.

Every schedule here is due 1-3 s ahead; the tests poll for the delivery against
deadlines, never sleep for it. "Once" and "not early" are read from the log files: one
``User`` with the schedule's key, whose time is not before the schedule's ``at``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from supervisor.client.direct import Client
from supervisor.errors import ControlError
from tests.harness.support import Daemon, kill_node, loopd, poll_until, running_daemon, wait_state
from worker.store.schedules import parse_time

pytestmark = pytest.mark.timeout(180)
APP = "tests.apps.schedule_apps:RemindingApp"
DEADLINE = 60.0


def _users(home: Path, session: str) -> list[tuple[str | None, str]]:
    """(key, time) of every User record of the session's logs, oldest epoch first."""
    found = []
    directory = home / "sessions" / session
    for log in sorted(directory.glob("*.jsonl"), key=lambda p: int(p.name.split(".")[0])):
        for line in log.read_bytes().splitlines():
            record = json.loads(line)
            if record["type"] == "User":
                found.append((record["key"], record["time"]))
    return found


def _delivered(home: Path, session: str, key: str) -> list[str]:
    return [when for k, when in _users(home, session) if k == key]


def _wait_delivered(home: Path, session: str, key: str, at: str) -> None:
    """The schedule ``key`` was applied exactly once, not before ``at``."""
    times = poll_until(lambda: _delivered(home, session, key), timeout=DEADLINE, what=key)
    assert len(times) == 1, times
    assert (parse_time(times[0]) or 0.0) >= (parse_time(at) or 0.0), (times[0], at)


def _schedule(home: Path, session: str, key: str, ahead: str, text: str = "later") -> str:
    done = loopd("schedule", "--home", str(home), session, text, "--at", ahead, "--key", key)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["duplicate"] is False
    return str(answer["at"])


def _worker_pid(home: Path, session: str) -> int:
    row = wait_state(home, session, "RUNNING")
    assert isinstance(row["pid"], int)
    return row["pid"]


def test_an_app_schedule_wakes_its_hibernated_session_and_is_delivered_once_not_early(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--app", APP, "--idle-stop", "0.3"), Client(str(home)) as client:
        client.call("create", session="s")
        answer = client.send("s", "remind 2 r1 wake up", key="k1")
        state = answer["state"]
        assert isinstance(state, dict)
        assert state["schedules"][0] == 1
        at = str(state["schedules"][1])
        wait_state(home, "s", "IDLE")  # hibernated before its time
        _wait_delivered(home, "s", "r1", at)
        assert [k for k, _ in _users(home, "s")] == ["k1", "r1"]


def test_a_schedule_survives_a_sigkill_of_its_worker(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home), Client(str(home)) as client:
        client.call("create", session="s")
        at = _schedule(home, "s", "w1", "+2s")
        os.kill(_worker_pid(home, "s"), signal.SIGKILL)
        _wait_delivered(home, "s", "w1", at)


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_a_schedule_is_delivered_after_the_supervisor_is_restarted(
    tmp_path: Path, how: str
) -> None:
    home = tmp_path / "home"
    daemon = Daemon(home, "--idle-stop", "0.3")
    try:
        with Client(str(home)) as client:
            client.call("create", session="s")
        at = _schedule(home, "s", "d1", "+3s")
        if how == "sigterm":
            assert daemon.stop() == 0
        else:
            kill_node(daemon)
        assert not _delivered(home, "s", "d1")
        daemon = Daemon(home, "--idle-stop", "0.3")
        _wait_delivered(home, "s", "d1", at)
    finally:
        daemon.stop()


def test_a_schedule_carried_over_an_epoch_commit_is_delivered(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home):
        loopd("create", "--home", str(home), "s")
        # Far enough ahead that c1 is still pending when the inspect below (the third CLI
        # process after it) looks: at +2 s a run at a load of 12 found it delivered.
        at = _schedule(home, "s", "c1", "+8s")
        done = loopd("compact", "--home", str(home), "s")
        assert done.returncode == 0, done.stderr
        inspected = loopd("inspect", "--home", str(home), "s", "--json")
        assert [p["key"] for p in json.loads(inspected.stdout)["schedules"]] == ["c1"]
        _wait_delivered(home, "s", "c1", at)
        assert (home / "sessions" / "s" / "1.jsonl").exists()


def test_a_cancelled_schedule_is_never_delivered_and_a_second_cancel_says_so(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home), Client(str(home)) as client:
        client.call("create", session="s")
        # Far enough ahead that x1 is still pending when the cancel (a CLI process, slow
        # on a loaded machine) reaches the daemon: at +1 s it was once delivered first.
        _schedule(home, "s", "x1", "+8s")
        at_later = _schedule(home, "s", "x2", "+9s")
        done = loopd("schedule", "--home", str(home), "s", "--cancel", "x1")
        assert json.loads(done.stdout)["cancelled"] is True
        again = client.cancel_schedule("s", "x1")
        assert again["cancelled"] is False
        assert again["why"] == "not pending"
        _wait_delivered(home, "s", "x2", at_later)  # delivered after x1's time
        assert not _delivered(home, "s", "x1")


def test_a_request_with_a_pending_key_before_its_time_is_refused_and_applies_nothing(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home), Client(str(home)) as client:
        client.call("create", session="s")
        at = client.schedule("s", "2099-01-01T00:00:00Z", "far", key="f1")["at"]
        with pytest.raises(ControlError, match=r"due at 2099-01-01T00:00:00\.000000Z, not before"):
            client.send("s", "early", key="f1")
        assert not _delivered(home, "s", "f1")
        assert at == "2099-01-01T00:00:00.000000Z"
        assert client.schedule("s", at, "far", key="f1")["duplicate"] is True
        shown = loopd("inspect", "--home", str(home), "s")
        assert "scheduled  1 pending:" in shown.stdout
        assert "f1  'far'" in shown.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--at", "tomorrow", "--key", "b1"], "--at"),
        (["--at", "2026-12-03T14:00:00", "--key", "b1"], "has no time zone"),
        (["--at", "+1h", "--key", "used"], "already applied; pick a new key"),
        # An empty key was replaced by a made-up one: each retry a new schedule.
        (["--at", "+1h", "--key", ""], "a schedule's key is 1-256 characters, got ''"),
        (["--at", "9999-12-31T23:59:59-01:00"], "is not a time from 0001 to 9999 in UTC"),
    ],
    ids=["unparsable", "no-zone", "key-used", "key-empty", "year-10000"],
)
def test_loopd_schedule_refuses_bad_input_with_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    home = tmp_path / "home"
    with running_daemon(home), Client(str(home)) as client:
        client.call("create", session="s")
        client.send("s", "hello", key="used")
        done = loopd("schedule", "--home", str(home), "s", "text", *args)
        assert done.returncode != 0
        assert message in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr


def test_no_worker_is_left_behind(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home) as daemon:
        loopd("create", "--home", str(home), "s")
        workers = daemon.workers()
    _gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive


def test_status_shows_what_is_scheduled_also_after_a_restart_from_the_daemons_file(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    daemon = Daemon(home, "--idle-stop", "0.3")
    try:
        with Client(str(home)) as client:
            client.call("create", session="s")
            client.schedule("s", "2099-01-02T00:00:00Z", "later", key="n2")
            first = client.schedule("s", "2099-01-01T00:00:00Z", "sooner", key="n1")["at"]
        wait_state(home, "s", "IDLE", scheduled=2, next_due=first)
        shown = loopd("status", "--home", str(home))
        assert "scheduled" in shown.stdout.splitlines()[0]
        assert daemon.stop() == 0
        daemon = Daemon(home, "--idle-stop", "0.3")
        wait_state(home, "s", "IDLE", scheduled=2, next_due=first)  # not woken for it
    finally:
        daemon.stop()


def test_a_deleted_sessions_schedules_leave_with_it_and_its_id_starts_with_none(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    derived = home / "schedules" / "s.json"
    daemon = Daemon(home)
    try:
        with Client(str(home)) as client:
            client.call("create", session="s")
            client.schedule("s", "2099-01-01T00:00:00Z", "later", key="n1")
        poll_until(derived.exists, timeout=DEADLINE, what="the daemon's schedules file")
        done = loopd("delete", "--home", str(home), "s")
        assert done.returncode == 0, done.stderr
        assert not derived.exists()  # gone with the session, not left for its id
        with Client(str(home)) as client:
            client.call("create", session="s")  # the same id again: a new session
        wait_state(home, "s", "RUNNING", scheduled=0, next_due=None)
        assert daemon.stop() == 0
        daemon = Daemon(home)
        wait_state(home, "s", "RUNNING", scheduled=0, next_due=None)
        # While a worker runs its file says so (live) and holds nothing of the old one's.
        assert json.loads(derived.read_text()) == {"live": True, "next": None, "pending": 0}
    finally:
        daemon.stop()


def test_a_schedules_file_that_could_not_be_written_is_written_again_and_a_restart_delivers(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    derived = home / "schedules" / "s.json"
    blocker = home / "schedules" / "s.json.tmp"  # a directory where the write's temp goes
    daemon = Daemon(home, "--idle-stop", "0.3")
    try:
        with Client(str(home)) as client:
            client.call("create", session="s")
            wait_state(home, "s", "IDLE")
            blocker.mkdir(parents=True)  # every write of the file fails from now on
        at = _schedule(home, "s", "w1", "+25s")
        wait_state(home, "s", "IDLE", scheduled=1)  # acknowledged, hibernated again
        assert not derived.exists()
        blocker.rmdir()  # the disk is writable again: the daemon writes the file by itself

        def written() -> dict[str, object] | None:
            found = json.loads(derived.read_text()) if derived.exists() else None
            return found if found is not None and found["pending"] == 1 else None

        # Before its time: the delivery's own wake would write the file (a live one).
        before_due = (parse_time(at) or 0.0) - time.time() - 2.0
        assert poll_until(written, timeout=before_due, what="the file")["next"] == at
        assert daemon.stop() == 0
        daemon = Daemon(home, "--idle-stop", "0.3")  # only the file knows of the schedule
        _wait_delivered(home, "s", "w1", at)
    finally:
        daemon.stop()
