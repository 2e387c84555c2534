"""An App's directory that hides one of loopd's own packages is named in the refusal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_a_worker_py_beside_the_app_is_named_as_what_hides_loopds_package(
    tmp_path: Path,
) -> None:
    team = tmp_path / "team"
    team.mkdir()
    (team / "team_agent.py").write_text(
        "from worker.app import DefaultApp\n\ndef team_agent(budget):\n"
        "    return DefaultApp(budget)\n"
    )
    (team / "worker.py").write_text("HELPERS = 1\n")  # the team's own helpers module
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    loopd = Path(sys.executable).parent / "loopd"  # the console script, as the guide runs it
    done = subprocess.run(
        [str(loopd), "serve", "--home", str(tmp_path / "home"), "--app",
         "team_agent:team_agent"],
        cwd=team, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    # Before, only "No module named 'worker.app'; 'worker' is not a package".
    assert f"{team / 'worker.py'} hides loopd's own package 'worker': rename it" in done.stderr
