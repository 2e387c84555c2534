"""``loopd --help`` lists each command with its line of ``SHORT_HELP`` (supervisor/cli/
group.py) instead of importing every command for it: each line is the command's own
short help, at every width, and the page is the one the loaded commands give."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click
import pytest

from supervisor.cli import tls_options
from supervisor.cli.group import COMMANDS, SHORT_HELP, listed, main
from supervisor.cluster import transport
from tests.harness.support import REPO

_HELP = """
import json, sys
from supervisor.cli import group
if {loaded!r}:
    group.SHORT_HELP.clear()  # every command loaded for its own line, as before
try:
    group.main(["--help"], prog_name="loopd")
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("supervisor", "chaos"))))
"""


def _loaded(name: str) -> click.Command:
    command = main.get_command(click.Context(main), name)
    assert command is not None, name
    assert not (command.help or "").startswith("(does not load"), command.help
    return command


@pytest.mark.parametrize("name", sorted(SHORT_HELP))
def test_each_help_line_is_the_commands_own_short_help_at_every_width(name: str) -> None:
    command = _loaded(name)
    for limit in (20, 45, 60, 68, 74, 100, 200, 1000):
        assert listed(name, SHORT_HELP[name]).get_short_help_str(limit) == (
            command.get_short_help_str(limit)
        ), limit


def test_every_command_and_plugin_has_a_help_line_and_no_line_is_of_none() -> None:
    names = main.list_commands(click.Context(main))
    assert sorted(SHORT_HELP) == sorted(names)
    assert set(COMMANDS) <= set(SHORT_HELP)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("columns", ["50", "80", "200"])
def test_help_is_the_page_the_loaded_commands_give_and_imports_none_of_them(
    columns: str,
) -> None:
    env = {**os.environ, "COLUMNS": columns}
    pages, modules = [], []
    for loaded in (False, True):
        done = subprocess.run(
            [sys.executable, "-c", _HELP.format(loaded=loaded)], cwd=REPO, env=env,
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        *page, last = done.stdout.splitlines()
        pages.append(page)
        modules.append(json.loads(last))
    assert pages[0] == pages[1]
    assert "Commands:" in pages[0]
    assert modules[0] == ["supervisor", "supervisor.cli", "supervisor.cli.group"]
    assert "chaos.cli" in modules[1], "the comparison loaded every command"


def test_the_tls_options_name_the_transports_environment_variables() -> None:
    assert tls_options.ENV == transport.ENV
