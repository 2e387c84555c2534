"""The rig's "damage" fault: a sealed log damaged under a live worker is always refused.

A flip (one letter's case, the JSON still valid) or a cut at a line boundary of the
newest sealed log, outside any crash; the invariant ``damage-refused`` holds when the
history reading, the sealed epoch's reader, a fresh worker (when open reads that log)
and repair all refuse it at its place, and nothing changes. A store that does not
check its checksums is caught.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.cases import Case
from chaos.faults.hook import FaultKind
from chaos.run.runner import clean_steps, run_case
from chaos.sweep.sweep import build_cases
from worker.store.epochs import sealed_logs
from worker.store.format import line_checksums


def _damage_cases(workdir: Path) -> list[Case]:
    cases = build_cases(["basic"], [FaultKind.DAMAGE], str(workdir))
    assert {c.variant for c in cases} == {"flip", "cut"}
    return cases


def test_every_damage_case_is_refused_at_its_place_and_changes_nothing(tmp_path: Path) -> None:
    clean_steps("basic", str(tmp_path))
    damaged = 0
    cases = _damage_cases(tmp_path)
    for case in [*cases[:-8:5], *cases[-8:]]:  # a sample, and every boundary of the end
        result = run_case(case, str(tmp_path))
        assert result.violations == [], f"replay: loopd chaos replay {case.id}"
        assert "damage-refused" in result.checked
        damaged += any("in sealed epoch" in note for note in result.notes)
    assert damaged >= 4  # flips and cuts, of the sealed epoch open reads too


@pytest.mark.parametrize("variant", ["flip", "cut"])
def test_a_store_that_ignores_its_checksums_is_caught(
    tmp_path: Path, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean_steps("basic", str(tmp_path))
    last = [c for c in _damage_cases(tmp_path) if c.variant == variant][-1]

    def accept(path: str, number: int, line: bytes, stored: object, running: int,
               summed_from: int) -> int:  # fmt: skip
        return 0

    monkeypatch.setattr("worker.store.epochs.epoch_log.chain_line", accept)
    monkeypatch.setattr(sealed_logs, "sealed_intact", lambda data, binding: True)
    monkeypatch.setattr(line_checksums, "sealed_intact", lambda data, binding: True)
    result = run_case(last, str(tmp_path))
    assert any(v.startswith("damage-refused") for v in result.violations), result.violations
