"""``loopd fork``'s first epoch names the App and version that built its baseline: shown by
``loopd status`` before a worker runs NEW, kept by the worker that does, and placed by
the older-version count; a fork of a session begun before versions names one too, and
the epochs it shares stay ID's bytes."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from supervisor.client import call
from tests.harness.support import loopd, poll_until, running_daemon, status, wait_state
from worker import Assistant, Session, User
from worker.app import DEFAULT_APP, DefaultApp
from worker.app.version import app_version

APP = '''
from worker.app import DefaultApp

version = {version!r}


class VersionedApp(DefaultApp):
    """The echo App; its module says which version it is."""
'''
TARGET = "vapp:VersionedApp"


def _deploy(source: Path, version: str) -> None:
    # Each version string has its own length: a .pyc is trusted by source size and mtime.
    (source / "vapp.py").write_text(APP.format(version=version))


def _records(home: Path, session: str, epoch: int) -> list[dict[str, object]]:
    log = home / "sessions" / session / f"{epoch}.jsonl"
    return [json.loads(line) for line in log.read_bytes().splitlines()]


def _named(record: dict[str, object]) -> tuple[object, object]:
    return record.get("app"), record.get("app_version")


@pytest.mark.timeout(180)
def test_a_forks_status_names_the_app_and_version_that_built_it_before_and_after_a_worker(
    tmp_path: Path,
) -> None:
    source, home = tmp_path / "src", tmp_path / "home"
    source.mkdir()
    home.mkdir()
    _deploy(source, "1")
    (home / "loopd.toml").write_text(
        f'[apps.ver]\napp = "{TARGET}"\npath = [{str(source)!r}]\nbudget = 30\n'
    )
    with running_daemon(home):
        assert loopd("create", "--home", str(home), "a", "--app", "ver").returncode == 0
        for n in range(3):  # each request commits: epochs 0..2 sealed, 3 open
            call(str(home), "send", session="a", text="x" * 80, key=f"k{n}")
        assert _named(_records(home, "a", 1)[0]) == (TARGET, "1")
        _deploy(source, "2.0")  # the code a's epoch 1 was begun with is gone
        done = loopd("fork", "a", "b", "--epoch", "1", "--home", str(home))
        assert done.returncode == 0, done.stderr
        start = _records(home, "b", 2)[0]
        assert (start["forked_from"], *_named(start)) == ("a", TARGET, "2.0")  # what built it
        row = wait_state(home, "b", "STOPPED")  # adopted; no worker has run it
        assert (row["pid"], row["app"], row["app_version"]) == (None, TARGET, "2.0")
        versions = call(str(home), "app_versions", timeout=60)
        assert isinstance(versions, dict)
        older = {r["session"]: r["older"] for r in versions["sessions"]}
        assert older == {"a": True, "b": False}  # a's epoch 3 names 1; b's names 2.0

        assert loopd("start", "b", "--home", str(home)).returncode == 0
        again = call(str(home), "send", session="b", text="x" * 80, key="k1")
        assert isinstance(again, dict)
        assert (again["duplicate"], again["epoch"]) == (True, 1)  # from the shared log
        row = wait_state(home, "b", "RUNNING")
        assert (row["app"], row["app_version"]) == (TARGET, "2.0")
        assert all(r["type"] != "AppChanged" for r in _records(home, "b", 2))  # same version
    verified = loopd("verify", "--home", str(home))
    assert verified.returncode == 0, verified.stdout


def test_a_fork_of_a_session_begun_before_versions_names_its_builder_and_shares_the_bytes(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    app = DefaultApp()
    with Session.create(home, "a", app.initial_baseline("a")) as s:  # stamps no App
        for n in range(2):
            s.append_many([User(text=f"t{n}", key=f"k{n}"), Assistant(text="a")])
            s.commit_epoch(app.summarize(s), app.next_baseline(s, app.summarize(s)))
    origin, fork = home / "sessions" / "a", home / "sessions" / "b"
    assert all(_named(r) == (None, None) for e in (0, 1, 2) for r in _records(home, "a", e))
    done = loopd("fork", "a", "b", "--epoch", "1", "--home", str(home))
    assert done.returncode == 0, done.stderr
    for name in ("0.jsonl", "1.jsonl"):  # old lines, without the block, as they were
        assert (fork / name).read_bytes() == (origin / name).read_bytes()
    start = _records(home, "b", 2)[0]
    assert _named(start) == (DEFAULT_APP, app_version(DEFAULT_APP))
    assert list(start)[-3:] == ["app", "app_version", "crc"]  # the free block, last
    verified = loopd("verify", "--home", str(home))
    assert verified.returncode == 0, verified.stdout
    with running_daemon(home):
        row = wait_state(home, "b", "RUNNING")
        assert (row["app"], row["app_version"]) == (DEFAULT_APP, app_version(DEFAULT_APP))
        assert status(home, "a")["app"] is None  # a's epoch 2 was begun before versions


HANGING_APP = '''
import os
import time

from worker.app import DefaultApp


class HangingApp(DefaultApp):
    """The echo App, whose next baseline never comes once {flag!r} exists."""

    def next_baseline(self, session, summary):
        while os.path.exists({flag!r}):
            time.sleep(0.05)
        return super().next_baseline(session, summary)
'''


@pytest.mark.timeout(180)
def test_a_sigkill_of_a_fork_in_its_apps_call_leaves_no_interpreter_behind(
    tmp_path: Path,
) -> None:
    source, home, flag = tmp_path / "src", tmp_path / "home", tmp_path / "hang"
    source.mkdir()
    home.mkdir()
    (source / "happ.py").write_text(HANGING_APP.format(flag=str(flag)))
    (home / "loopd.toml").write_text(
        f'[apps.hang]\napp = "happ:HangingApp"\npath = [{str(source)!r}]\nbudget = 30\n'
    )
    with running_daemon(home):
        assert loopd("create", "--home", str(home), "a", "--app", "hang").returncode == 0
        for n in range(2):  # each request commits: epoch 0 and 1 sealed
            call(str(home), "send", session="a", text="x" * 80, key=f"k{n}")
    flag.touch()  # from now on the App's next_baseline hangs
    fork = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "fork", "a", "b", "--epoch", "1", "--home",
         str(home)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    children: list[psutil.Process] = []
    try:
        children = poll_until(
            lambda: psutil.Process(fork.pid).children(), what="the fork's App child"
        )
        fork.send_signal(signal.SIGKILL)
        assert fork.wait(timeout=30) == -signal.SIGKILL
        _gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, [p.cmdline() for p in alive]  # killed with the command
    finally:
        fork.kill()
        fork.wait()
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
