"""The full chaos sweep: every scenario, every fault kind, and every compound case.

Behind the ``sweep`` marker (``pytest -m sweep -n auto``); the default run leaves it out.
Its cases are only built when the marker is selected, so the default run pays nothing.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression  # pytest's own -m evaluator; it has no public one

from chaos.cases import Case
from chaos.run.runner import clean_steps, run_case
from chaos.scenarios.scenarios import SCENARIOS
from chaos.sweep.sweep import ALL_FAULTS, build_cases


def selects_the_sweep(markexpr: str) -> bool:
    """True when the ``-m`` expression ``markexpr`` keeps a test marked ``sweep``.

    Evaluated as pytest evaluates it: the default ``not sweep and not cluster_sweep ...``
    keeps none (a substring test once read ``cluster_sweep`` as asking for the sweep and
    built all 85,000 cases at every collection, issue 32).
    """
    if not markexpr.strip():
        return True
    return Expression.compile(markexpr).evaluate(_only_the_sweep_mark)


def _only_the_sweep_mark(name: str, /, **_arguments: str | int | bool | None) -> bool:
    return name == "sweep"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sweep_case" not in metafunc.fixturenames:
        return
    cases: list[Case] = []
    if selects_the_sweep(str(metafunc.config.getoption("markexpr") or "")):
        with tempfile.TemporaryDirectory(prefix="loopd-collect-") as workdir:
            cases = build_cases(sorted(SCENARIOS), ALL_FAULTS, workdir, compound=True)
    metafunc.parametrize("sweep_case", cases, ids=[c.id for c in cases])


@pytest.mark.sweep
def test_every_case_of_the_full_sweep_holds_every_invariant(
    sweep_case: Case, tmp_path: Path
) -> None:
    clean_steps(sweep_case.scenario, str(tmp_path))
    result = run_case(sweep_case, str(tmp_path))
    assert result.violations == [], f"replay: loopd chaos replay {sweep_case.id}"


@pytest.mark.parametrize(
    ("markexpr", "selected"),
    [
        ("not sweep and not long_soak and not cluster_sweep and not mutants_full", False),
        ("sweep", True),
        ("sweep or cluster_sweep", True),
        ("cluster_sweep", False),
        ("not cluster_sweep", True),
        ("", True),
    ],
    ids=["default", "sweep", "either", "cluster-only", "all-but-cluster", "empty"],
)
def test_the_sweep_cases_are_built_only_when_the_mark_expression_keeps_the_sweep(
    markexpr: str, selected: bool
) -> None:
    assert selects_the_sweep(markexpr) is selected
