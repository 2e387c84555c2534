"""``loopd verify`` reads every epoch's baseline, where open reads only the newest one."""

from __future__ import annotations

from pathlib import Path

from tests.harness.keyed_sessions import keyed_session
from tests.harness.support import loopd
from worker import Session


def test_verify_refuses_a_damaged_or_missing_older_baseline_that_open_does_not_read(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    changed = keyed_session(home, "changed", epochs=3) / "1.baseline.json"
    changed.write_bytes(changed.read_bytes().replace(b"{", b"{ ", 1))  # still JSON
    missing = keyed_session(home, "missing", epochs=3) / "0.baseline.json"
    missing.unlink()
    keyed_session(home, "whole", epochs=3)
    for name in ("changed", "missing", "whole"):  # open reads the newest epoch's only
        with Session.open(home, name) as session:
            assert session.epoch == 2
    said = loopd("verify", "--home", str(home))
    assert said.returncode == 1, said.stdout
    lines = said.stdout.splitlines()
    changed_line = next(line for line in lines if " changed " in line)
    assert changed_line.startswith("REFUSED"), changed_line
    assert f"{changed}: " in changed_line, changed_line
    missing_line = next(line for line in lines if " missing " in line)
    assert f"{missing}: baseline file is missing" in missing_line, missing_line
    assert any(line.startswith("ok       whole  epoch 2") for line in lines), lines
    assert lines[-1] == "3 sessions, 2 refused"
    # inspect --all reads the history too, and says the same.
    history = loopd("inspect", "--home", str(home), "changed", "--all")
    assert history.returncode == 1
    assert str(changed) in history.stderr
