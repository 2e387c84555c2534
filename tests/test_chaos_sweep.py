"""The full chaos sweep: every scenario, every fault kind, and every compound case.

Behind the ``sweep`` marker (``pytest -m sweep -n auto``); the default run leaves it out.
Its cases are only built when the marker is selected, so the default run pays nothing.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from chaos.cases import Case
from chaos.runner import clean_steps, run_case
from chaos.scenarios import SCENARIOS
from chaos.sweep import ALL_FAULTS, build_cases


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sweep_case" not in metafunc.fixturenames:
        return
    cases: list[Case] = []
    if "sweep" in str(metafunc.config.getoption("markexpr")).replace("not sweep", ""):
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
