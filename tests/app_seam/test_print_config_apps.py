"""``loopd serve --print-config`` shows the named Apps of loopd.toml too, as TOML that reads
back to the same Apps."""

from __future__ import annotations

import tomllib
from pathlib import Path

from supervisor.hosting.config import read_apps
from tests.harness.support import loopd

APPS = """
max-live = 9

[apps.agent]
app = "examples.agent_app:AgentApp"
path = ["/srv/agent/src", "/srv/shared"]
cwd = "/srv/agent"
env = { LOOPD_MODEL_URL = "http://127.0.0.1:8080/v1", "odd key.x" = "quote \\" and \\\\ " }
budget = 8000
hang-timeout = 120
request-deadline = 600.5

[apps."v2.tagged"]
app = "tagged_app:TaggedApp"
"""


def test_print_config_shows_the_named_apps_and_reads_back_to_them(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "loopd.toml").write_text(APPS)
    shown = loopd("serve", "--home", str(home), "--print-config")
    assert shown.returncode == 0, shown.stderr
    assert "max-live = 9\n" in shown.stdout
    assert '[apps.agent]\napp = "examples.agent_app:AgentApp"\n' in shown.stdout
    assert '[apps."v2.tagged"]\napp = "tagged_app:TaggedApp"\n' in shown.stdout
    again = tmp_path / "again"
    again.mkdir()
    (again / "loopd.toml").write_text(shown.stdout)
    assert read_apps(str(again / "loopd.toml")) == read_apps(str(home / "loopd.toml"))
    assert tomllib.loads(shown.stdout)["apps"]["agent"]["env"]["odd key.x"] == 'quote " and \\ '
    assert loopd("serve", "--home", str(again), "--print-config").stdout == shown.stdout


def test_print_config_refuses_a_bad_app_table_in_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "loopd.toml").write_text('[apps.agent]\napp = "x:Y"\nbudjet = 5\n')
    shown = loopd("serve", "--home", str(home), "--print-config")
    assert shown.returncode == 1
    assert shown.stderr.startswith("loopd serve: ")
    assert "[apps.agent]: unknown key 'budjet'" in shown.stderr
    assert shown.stderr.count("\n") == 1
