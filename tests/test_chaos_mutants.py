"""Test the tester: the rig catches every deliberately broken store, for the right reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.mutants import MUTANTS
from chaos.scoring import score_mutant


def test_every_mutant_names_the_invariant_that_must_catch_it() -> None:
    assert len(MUTANTS) >= 8
    for mutant in MUTANTS.values():
        assert mutant.caught_by
        assert mutant.bug


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_rig_catches_the_mutant_by_the_invariant_it_breaks(name: str, tmp_path: Path) -> None:
    score = score_mutant(name, str(tmp_path), jobs=1, quick=True)
    assert score.caught, f"mutant {name} survived {score.cases} cases"
    assert score.caught_as_expected, f"{name} caught only by {dict(score.invariants)}"
