"""The full chaos sweep: every scenario, every fault kind, and every compound case.

Behind the ``sweep`` marker (``pytest -m sweep -n auto``); the default run leaves it out.
Its cases are only built when the marker is selected, so the default run pays nothing.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Final

import pytest

from chaos.cases import Case
from chaos.hook import FaultKind
from chaos.runner import clean_steps, run_case
from chaos.scenarios import SCENARIOS
from chaos.sweep import ALL_FAULTS, build_cases
from worker import records

# As in tests/test_chaos_default.py: the store closes issue 7 once it has decode_line.
STORE_CLOSES_ISSUE_7: Final = hasattr(records, "decode_line")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sweep_case" not in metafunc.fixturenames:
        return
    cases: list[Case] = []
    if "sweep" in str(metafunc.config.getoption("markexpr")).replace("not sweep", ""):
        with tempfile.TemporaryDirectory(prefix="loopd-collect-") as workdir:
            cases = build_cases(sorted(SCENARIOS), ALL_FAULTS, workdir, compound=True)
    metafunc.parametrize("sweep_case", [_param(c) for c in cases])


def _param(case: Case) -> object:
    # Before the store closes issue 7, the rig finds its holes in these kinds of case
    # (tests/test_chaos_default.py lists the exact ones of the default slice).
    open_hole = case.power_at is not None or case.fault in (FaultKind.TORN, FaultKind.POWER)
    if open_hole and not STORE_CLOSES_ISSUE_7:
        return pytest.param(case, id=case.id, marks=pytest.mark.xfail(
            reason="may hit a hole of the store before issue 7", strict=False))  # fmt: skip
    return pytest.param(case, id=case.id)


@pytest.mark.sweep
def test_every_case_of_the_full_sweep_holds_every_invariant(
    sweep_case: Case, tmp_path: Path
) -> None:
    clean_steps(sweep_case.scenario, str(tmp_path))
    result = run_case(sweep_case, str(tmp_path))
    assert result.violations == [], f"replay: loopd chaos replay {sweep_case.id}"
