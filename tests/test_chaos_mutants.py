"""Test the tester: the rig catches every deliberately broken store, for the right reason."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from chaos.mutants import MUTANTS
from chaos.parallel import run_cases
from chaos.sweep import build_cases


def test_every_mutant_names_the_invariant_that_must_catch_it() -> None:
    assert len(MUTANTS) >= 8
    for mutant in MUTANTS.values():
        assert mutant.caught_by
        assert mutant.faults


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_rig_catches_the_mutant_by_the_invariant_it_breaks(name: str, tmp_path: Path) -> None:
    mutant = MUTANTS[name]
    workdir = str(tmp_path)
    cases = build_cases(
        mutant.scenarios, mutant.faults, workdir, then_power=mutant.then_power, mutant=name
    )
    results = run_cases(cases, workdir, jobs=1, on_result=lambda _r: None)
    caught = Counter(v.split(":")[0] for r in results for v in r.violations)
    assert caught, f"mutant {name} survived {len(cases)} cases"
    assert mutant.caught_by in caught, f"{name} caught only by {dict(caught)}"
