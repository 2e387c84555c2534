"""The README's first command: ``loopd demo`` runs every check and exits 0."""

from __future__ import annotations

from pathlib import Path

from tests.harness.support import loopd


def test_the_demo_holds_every_check_and_exits_0(tmp_path: Path) -> None:
    ran = loopd("demo", "--home", str(tmp_path / "demo"))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "[FAILED]" not in ran.stdout
    last = ran.stdout.strip().splitlines()[-1]
    held, total = last.split()[0].split("/")
    assert held == total
    assert int(total) >= 15
