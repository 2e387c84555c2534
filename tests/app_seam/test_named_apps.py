"""Named Apps of loopd.toml: each session runs the App it was created with, at every restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.client import Client, call
from supervisor.errors import ControlError
from tests.harness.named_app_homes import home_with_apps
from tests.harness.support import REPO, loopd, poll_until, running_daemon, status, wait_state


@pytest.mark.parametrize("method", ["auto", "fork", "exec"])  # auto: a template
def test_a_session_created_with_a_named_app_runs_it_after_a_kill_and_a_supervisor_restart(
    tmp_path: Path, method: str
) -> None:
    home, work = home_with_apps(tmp_path)
    with running_daemon(home, "--start-method", method):
        created = loopd("create", "--home", str(home), "agent", "--app", "tagged")
        assert created.returncode == 0, created.stderr
        call(str(home), "create", session="plain")
        with Client(str(home)) as client:
            first = client.send("agent", "hello", key="k1")
            plain = client.send("plain", "hello", key="p1")
            pid = int(str(status(home, "agent")["pid"]))
            os.kill(pid, signal.SIGKILL)
            poll_until(lambda: status(home, "agent")["pid"] not in (None, pid), what="a new worker")
            wait_state(home, "agent", "RUNNING")
            after_kill = client.send("agent", "again", key="k2")
    with running_daemon(home, "--start-method", method), Client(str(home)) as client:
        after_restart = client.send("agent", "once more", key="k3")
    for reply in (first, after_kill, after_restart):
        assert (reply["tag"], reply["cwd"], reply["budget"]) == ("blue", str(work), 123456)
    assert "tag" not in plain  # serve's default App: the echo app
    assert '"apps":{"agent":"tagged"}' in (home / "intent.json").read_text()


def test_serve_refuses_an_app_that_does_not_import_in_one_line_before_serving(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "loopd.toml").write_text('[apps.broken]\napp = "no_such_module_here:App"\n')
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "serve", "--home", str(home)],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert "app 'broken' (no_such_module_here:App): does not import" in done.stderr
    assert "ModuleNotFoundError" in done.stderr
    assert not (home / "loopd.sock").exists()


def test_serve_refuses_a_default_app_attribute_that_is_missing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "serve", "--home", str(tmp_path / "home"),
         "--app", "tests.apps.slow_apps:NoSuchApp"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.startswith(
        "loopd serve: --app tests.apps.slow_apps:NoSuchApp: does not import"
    )
    assert "AttributeError" in done.stderr


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ("[apps.a]\nbudget = 5\n", "[apps.a]: key 'app' (module:attribute) is required"),
        ('[apps.a]\napp = "m:A"\nenvironment = {}\n', "[apps.a]: unknown key 'environment'"),
        ('[apps.a]\napp = "m:A"\nhang-timeout = nan\n', "key 'hang-timeout' must be a number"),
        ('[apps.a]\napp = "m:A"\nhang-timeout = 900000.0\n', "a number from 0.1 to 604800"),
        ('[apps.a]\napp = "m:A"\nenv = { X = 1 }\n', "key 'env' must be a table of strings"),
        ("apps = 3\n", "'apps' must be a table of [apps.NAME] tables"),
    ],
    ids=[
        "no-app",
        "unknown-key",
        "nan-timeout",
        "timeout-over-a-week",
        "env-not-strings",
        "apps-not-a-table",
    ],
)
def test_a_badly_configured_app_is_refused_naming_its_key(
    tmp_path: Path, toml: str, expected: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "loopd.toml").write_text(toml)
    done = loopd("serve", "--home", str(home))
    assert done.returncode == 1
    assert expected in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_create_with_an_app_the_config_does_not_name_is_refused_and_creates_nothing(
    tmp_path: Path,
) -> None:
    home, _work = home_with_apps(tmp_path)
    with running_daemon(home):
        with pytest.raises(ControlError, match=r"no App named 'other'.*configured: tagged"):
            call(str(home), "create", session="s", app="other")
        assert not (home / "sessions" / "s").exists()
        rows = call(str(home), "status")
    assert rows == []
