"""Test the tester: the rig catches every deliberately broken store, for the right reason."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from chaos.mutants import MUTANTS
from chaos.parallel import run_cases
from chaos.sweep import ALL_FAULTS, build_cases

# The invariant that must be among those that catch each mutant.
EXPECTED = {
    "no-fsync": "acknowledged-on-disk",
    "fsync-after-memory": "acknowledged-on-disk",
    "no-directory-fsync": "acknowledged-on-disk",
    "second-epoch-end-on-resume": "one-epoch-end-last",
    "silent-torn-tail-repair": "torn-log-refused-unchanged",
    "no-lock": "single-writer",
    "recorded-summary-rewritten": "carry-is-recorded-summary",
    "call-numbers-per-epoch": "call-numbers-unique",
}


def test_every_mutant_has_an_expected_catch() -> None:
    assert set(EXPECTED) == set(MUTANTS)
    assert len(MUTANTS) >= 6


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_rig_catches_the_mutant(mutant: str, tmp_path: Path) -> None:
    workdir = str(tmp_path)
    cases = build_cases(["basic"], ALL_FAULTS, workdir, mutant=mutant)
    results = run_cases(cases, workdir, jobs=1, on_result=lambda _r: None)
    caught = Counter(v.split(":")[0] for r in results for v in r.violations)
    assert caught, f"mutant {mutant} survived {len(cases)} cases"
    assert EXPECTED[mutant] in caught, f"{mutant} caught only by {dict(caught)}"
