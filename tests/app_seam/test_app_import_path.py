"""Where an App is imported from: the guide's commands, run as written from a fresh clone.

The installed ``loopd`` console script of the test's interpreter is what runs, from the
clone's root (and from a team's own folder), in an environment without PYTHONPATH: a
console script's ``sys.path[0]`` is its own folder, not the working directory, so only
the rule of ``supervisor.hosting.apps.app_import_path`` lets ``--app`` find the module.
"""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from supervisor.client import call
from supervisor.control_socket import SOCKET_NAME
from supervisor.errors import ControlError
from tests.harness.support import REPO, poll_until

GUIDE = REPO / "docs" / "apps.md"
LOOPD = Path(sys.executable).parent / "loopd"
# The guide's commands, as docs/apps.md writes them (checked below, so the two cannot drift).
AGENT_SERVE = (
    "LOOPD_AGENT_URL=http://127.0.0.1:8080 loopd serve --home H --app examples.agent_app:AgentApp"
)
AGENT_CREATE = "loopd create --home H s1"
AGENT_SEND = 'loopd send --home H s1 "what is 12 * 7?" --key t1'
TEAM_SERVE = "loopd serve --home H --app team_agent:team_agent"
TEAM_CREATE = "loopd create --home H s1"
TEAM_SEND = 'loopd send --home H s1 "hello team" --key t1'


def _guide_env() -> dict[str, str]:
    """The operator's shell: an activated venv, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{LOOPD.parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _argv(command: str, home: Path, port: int | None = None) -> tuple[dict[str, str], list[str]]:
    """A guide command's environment and argv: H is the test's home, 8080 the fake's port."""
    words = shlex.split(command)
    env = _guide_env()
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        env[name] = value.replace(":8080", f":{port}") if port is not None else value
    assert words[0] == "loopd", command
    argv = [str(LOOPD), *(str(home) if word == "H" else word for word in words[1:])]
    return env, argv


def _run(command: str, home: Path, cwd: Path) -> str:
    env, argv = _argv(command, home)
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"{command}: exit {done.returncode}: {done.stderr.strip()}"
    return done.stdout


@contextmanager
def _serving(
    command: str, home: Path, cwd: Path, port: int | None = None, env: dict[str, str] | None = None
) -> Iterator[None]:
    """``loopd serve`` as the guide starts it, until it answers; SIGTERM, reap, at the end."""
    guide_env, argv = _argv(command, home, port)
    env = {**guide_env, **(env or {})}
    log_path = home.parent / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)

    def answers() -> bool:
        if proc.poll() is not None:
            out = log_path.read_text(errors="replace").strip()
            raise AssertionError(f"{command}: exit {proc.returncode}: {out}")
        if not (home / SOCKET_NAME).exists():
            return False
        try:
            call(str(home), "ping", timeout=5)
        except ControlError:
            return False
        return True

    try:
        poll_until(answers, timeout=60, what="loopd serve to answer")
        yield
    finally:
        workers = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        _gone, alive = psutil.wait_procs(workers, timeout=10)
        for worker in alive:
            worker.kill()


@contextmanager
def _fake_model(cwd: Path) -> Iterator[int]:
    """The guide's ``python -m examples.fake_model``, on a free port (``--port 0``)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "examples.fake_model", "--port", "0", "--delay", "0"],
        cwd=cwd, env=_guide_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready, "the fake model printed no port within 60 s"
        yield int(proc.stdout.readline())
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A fresh clone of the repository the tests run from, without its own copies of the
    installed packages: what runs is the installed code under test, from the clone's root
    only what a checkout adds (``examples``)."""
    target = tmp_path / "clone"
    git = shutil.which("git")
    assert git is not None, "git is not installed"
    subprocess.run(
        [git, "clone", "--quiet", "--no-local", str(REPO), str(target)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    for package in ("worker", "supervisor", "chaos"):
        shutil.rmtree(target / package)
    return target


def _guide() -> str:
    return GUIDE.read_text()


def test_the_guide_writes_the_commands_this_test_runs() -> None:
    guide = _guide()
    for command in (AGENT_SERVE, AGENT_CREATE, AGENT_SEND, TEAM_SERVE, TEAM_SEND):
        assert command in guide, command


def test_the_guides_agent_serves_from_a_fresh_clones_root_without_pythonpath(
    clone: Path, tmp_path: Path
) -> None:
    home = tmp_path / "H"
    with _fake_model(clone) as port, _serving(AGENT_SERVE, home, clone, port):
        _run(AGENT_CREATE, home, clone)
        reply = json.loads(_run(AGENT_SEND, home, clone))
    assert reply["duplicate"] is False
    assert "84" in reply["text"], reply  # the model called calculate(12 * 7)
    assert [tool["output"] for tool in reply["tools"]] == ["84"]


def _team_app() -> str:
    """The guide's ``team_agent.py``: the python block that follows its name."""
    found = re.search(r"`team_agent\.py`[^`]*?```python\n(.*?)```", _guide(), re.S)
    assert found, "docs/apps.md shows no team_agent.py"
    return found.group(1)


def test_a_teams_own_app_serves_from_its_folder_without_pythonpath(tmp_path: Path) -> None:
    team = tmp_path / "team"
    team.mkdir()
    (team / "team_agent.py").write_text(_team_app())
    home = tmp_path / "H"
    with _serving(TEAM_SERVE, home, team):
        _run(TEAM_CREATE, home, team)
        reply = json.loads(_run(TEAM_SEND, home, team))
    assert reply["text"] == "echo: hello team", reply
    baseline = json.loads((home / "sessions" / "s1" / "0.baseline.json").read_bytes())
    assert baseline["system"] == "team agent for s1"  # the team's App, not the default


SHADOWED = 'raise ImportError("the copy on PYTHONPATH was imported")\n'
RIG = (
    "loopd chaos run --app team_agent:team_agent --scenario requests --faults kill"
    " --no-compound --sample 1 --jobs 1"
)


def _shadowed_team(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A team folder with ``team_agent.py``, and a PYTHONPATH holding another copy."""
    team, other = tmp_path / "team", tmp_path / "other"
    team.mkdir()
    other.mkdir()
    (team / "team_agent.py").write_text(_team_app())
    (other / "team_agent.py").write_text(SHADOWED)
    return team, {"PYTHONPATH": str(other)}


def test_serve_imports_the_working_directorys_app_before_one_on_pythonpath(
    tmp_path: Path,
) -> None:
    team, env = _shadowed_team(tmp_path)
    home = tmp_path / "H"
    with _serving(TEAM_SERVE, home, team, env=env):
        _run(TEAM_CREATE, home, team)
        reply = json.loads(_run(TEAM_SEND, home, team))
    assert reply["text"] == "echo: hello team", reply


def test_the_rig_imports_the_app_from_where_serve_does(tmp_path: Path) -> None:
    team, env = _shadowed_team(tmp_path)
    argv = [str(LOOPD), *shlex.split(RIG)[1:], "--dir", str(tmp_path)]
    done = subprocess.run(
        argv, cwd=team, env={**_guide_env(), **env},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1:]
