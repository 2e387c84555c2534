"""The rig loads an App as `loopd serve` does: checked in a child interpreter, imported by
each worker after its fork; an App that fails with no fault stops the rig in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from supervisor.client import Client, call
from tests.harness.support import REPO, running_daemon

TRAP = "tests.apps.import_trap_apps:ThreadAtImportApp"


def _rig(tmp_path: Path, app: str, *, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "supervisor", "chaos", "run", "--app", app, "--scenario",
         "requests", "--faults", "kill", "--sample", "3", "--seed", "1", "--jobs", "1",
         "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=100, cwd=cwd, env=env, check=False,
    )  # fmt: skip


def test_an_app_whose_client_thread_starts_at_import_passes_the_rig_as_serve_hosts_it(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--app", TRAP):
        call(str(home), "create", session="s1")
        with Client(str(home), timeout=60) as client:
            assert client.send("s1", "hello", key="k1")["text"] == "echo: hello"
    ran = _rig(tmp_path, TRAP)
    # Before, the rig imported the App itself and forked its workers from it: they had
    # the client but not its thread, and the clean run failed (a traceback).
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert "0 violations" in ran.stderr or " 0 " in ran.stdout


def test_an_app_that_fails_every_request_stops_the_rig_in_one_line_with_its_error(
    tmp_path: Path,
) -> None:
    team = tmp_path / "team"
    team.mkdir()
    (team / "failing_app.py").write_text(
        "from worker.app import DefaultApp\n"
        "class Failing(DefaultApp):\n"
        "    def handle(self, session, request):\n"
        "        raise RuntimeError('the model endpoint is not configured')\n"
        "def make(budget):\n"
        "    return Failing(budget)\n"
    )
    ran = _rig(tmp_path, "failing_app:make", cwd=team)
    assert ran.returncode == 1, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert "Traceback" not in ran.stderr
    assert ran.stderr.strip().splitlines()[-1] == (
        "Error: the clean run of requests through failing_app:make (no fault) exited "
        "with 1: worker.loop.turns.AppFailed: the App raised RuntimeError: the model endpoint is "
        "not configured"
    )


def test_an_app_that_does_not_import_is_refused_by_the_rig_as_serve_refuses_it(
    tmp_path: Path,
) -> None:
    ran = _rig(tmp_path, "no_such_module_here:make", cwd=tmp_path)
    assert ran.returncode == 2, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert "Traceback" not in ran.stderr
    assert "No module named 'no_such_module_here'" in ran.stderr
