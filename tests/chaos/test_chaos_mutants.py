"""Test the tester: the rig catches every deliberately broken store, for the right reason.

The supervisor's mutants (``SERVE_MUTANTS``) are run in a real serve by the
supervisor-level runs, with and without each.

By default each mutant is run on its pinned cases (``chaos/mutants/pinned.py``, picked
from its whole quick selection by ``python -m scripts.chaos.pin_mutant_cases``); the whole
quick selection of every mutant runs with ``-m mutants_full``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.cases import Case
from chaos.mutants import MUTANTS, SERVE_MUTANTS
from chaos.mutants.pinned import PINNED
from chaos.report.scoring import SERVE_SEED, feature_table, score_mutant, score_serve_mutant
from chaos.run.supervised import run_supervised

REPIN = "python -m scripts.chaos.pin_mutant_cases --only {name}"


def test_every_mutant_names_the_invariant_that_must_catch_it() -> None:
    assert len(MUTANTS) >= 8
    for mutant in MUTANTS.values():
        assert mutant.caught_by
        assert mutant.bug


def test_every_mutant_has_pinned_cases_that_parse() -> None:
    assert set(PINNED) <= set(MUTANTS), (
        f"pinned cases of unknown mutants: {set(PINNED) - set(MUTANTS)}"
    )
    for name, mutant in MUTANTS.items():
        pins = mutant.quick or PINNED.get(name, ())
        assert pins, f"mutant {name} has no pinned cases: run {REPIN.format(name=name)}"
        for case_id in pins:
            assert Case.parse(case_id).id == case_id
            assert case_id.partition(":")[0] in mutant.scenarios, (name, case_id)


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_rig_catches_the_mutant_on_its_pinned_cases(name: str, tmp_path: Path) -> None:
    score = score_mutant(name, str(tmp_path), jobs=1, quick=True)
    again = REPIN.format(name=name)
    assert score.caught, f"mutant {name} survived its {score.cases} pinned cases (re-pin: {again})"
    assert score.caught_as_expected, f"{name} caught only by {dict(score.invariants)} ({again})"


@pytest.mark.mutants_full
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_rig_catches_the_mutant_in_its_whole_quick_selection(name: str, tmp_path: Path) -> None:
    mutant = MUTANTS[name]
    score = score_mutant(name, str(tmp_path), jobs=1, quick=True, scenarios=mutant.scenarios)
    assert score.caught, f"mutant {name} survived {score.cases} cases"
    assert score.caught_as_expected, f"{name} caught only by {dict(score.invariants)}"


def test_the_score_per_feature_counts_each_features_caught_mutants_of_its_own() -> None:
    table = feature_table({"streaming": [True, False], "durable writes": [True, True, True]})
    assert table == [
        "by feature (mutants caught by the invariant each must break):",
        "  durable writes  3/3",
        "  streaming       1/2",
    ]
    assert {m.area for m in MUTANTS.values()} >= {"durable writes", "the epoch commit"}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory of a short path: under xdist, pytest's ``tmp_path`` and the rig's own
    folders make a home whose control socket is past the Unix socket's 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="loopd-m-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", sorted(SERVE_MUTANTS))
def test_a_supervisor_mutant_is_caught_by_its_invariant_alone(name: str, short_dir: Path) -> None:
    """A real serve with the mutant patched in breaks the invariant it must break and no
    other; the same run without it breaks none."""
    score = score_serve_mutant(name, str(short_dir))
    assert not score.clean.violations, score.clean.violations
    assert not score.clean.failures, score.clean.failures
    assert not score.broken.failures, score.broken.failures
    assert set(score.invariants) == {SERVE_MUTANTS[name].caught_by}, score.broken.violations


@pytest.mark.timeout(120)
def test_the_template_mutant_leaves_the_plain_fork_whole(short_dir: Path) -> None:
    """Only the template path is broken: with every worker forked from serve itself, the
    same run holds every invariant."""
    report = run_supervised(str(short_dir / "home"), sessions=3, requests=150, duration=60.0,
                            seed=SERVE_SEED, mutant="template-worker-keeps-template-channel",
                            start_method="fork")  # fmt: skip
    assert not report.violations, report.violations
    assert not report.failures, report.failures
