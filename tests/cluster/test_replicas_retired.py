"""``--replicas`` is retired: loopd no longer copies logs between hosts (docs/scaling.md).

Every command that took a replica count answers one line pointing at ``--store`` and
exits 2, before it reads a home, reaches etcd or starts anything.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.support import REPO

RETIRED = (
    "--replicas is retired: loopd no longer copies logs between hosts; put sessions in "
    "PostgreSQL with --store postgresql://... (docs/scaling.md)"
)


@pytest.mark.parametrize(
    ("command", "args"),
    [
        pytest.param("serve", ["--replicas", "3"], id="serve-replicas-3"),
        pytest.param("serve", ["--replicas=1"], id="serve-replicas-1"),
        pytest.param("create", ["s1", "--replicas", "2"], id="create-with-home"),
        pytest.param(
            "create",
            ["s1", "--cluster", "http://127.0.0.1:9", "--replicas", "3"],
            id="create-with-cluster",
        ),
    ],
)
def test_replicas_is_refused_in_one_line_pointing_at_the_store(
    tmp_path: Path, command: str, args: list[str]
) -> None:
    home = tmp_path / "home"
    where = ["--home", str(home)] if "--cluster" not in args else []
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", command, *where, *args],
        cwd=REPO, check=False, capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [f"loopd {command}: {RETIRED}"]
    assert not home.exists()  # nothing was made before the refusal


def test_a_serve_without_replicas_does_not_mention_them_in_its_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "serve", "--help"],
        cwd=REPO, check=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "--replicas" not in done.stdout
    assert "--zone" not in done.stdout
