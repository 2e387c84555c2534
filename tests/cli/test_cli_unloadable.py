"""A command whose module does not load (a broken plugin, a damaged install) is one
line, not a traceback, and the other commands and ``loopd --help`` still work."""

from __future__ import annotations

import subprocess
import sys

import pytest

_PROGRAM = """
import sys
from supervisor.cli import group
group.COMMANDS["broken"] = "no_such_module_of_loopd:command"
group.main(sys.argv[1:], prog_name="loopd")
"""


def _loopd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _PROGRAM, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.timeout(120)
def test_help_lists_a_command_that_does_not_load_with_why() -> None:
    done = _loopd("--help")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    line = next(line for line in done.stdout.splitlines() if line.strip().startswith("broken"))
    assert "does not load" in line, line
    assert "serve" in done.stdout  # the others are listed as ever


@pytest.mark.timeout(120)
def test_running_a_command_that_does_not_load_is_one_line_and_exit_1() -> None:
    done = _loopd("broken", "--some-flag", "x")
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("loopd broken: the command does not load"), done.stderr
    assert "no_such_module_of_loopd" in done.stderr
