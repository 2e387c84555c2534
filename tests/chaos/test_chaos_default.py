"""The default chaos slice: every boundary of scenario 1 under kill, torn and power loss,
every boundary of a session written before SessionStart carried state under kill, and
the "fault, resume, then power loss" compounds of scenario 1 and of the worker loop.

The same cases ``loopd chaos run`` runs, as pytest parameters, so ``pytest -n auto``
shards them. The full sweep (every scenario, every fault, every compound) is marked
``sweep``: ``pytest -m sweep``. As in ``loopd chaos run``, a case whose crash state an
earlier case of the same process checked takes that verdict (``chaos.run.crash_states``);
``.ci/run`` adds a budgeted stratified sample of every scenario and fault kind.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from chaos.cases import Case, ThenPower
from chaos.faults.hook import FaultKind
from chaos.run.crash_states import StateCache
from chaos.run.runner import clean_steps, run_case
from chaos.sweep.sweep import build_cases


def _default_cases() -> list[Case]:
    with tempfile.TemporaryDirectory(prefix="loopd-collect-") as workdir:
        cases = build_cases(["basic"], [FaultKind.KILL, FaultKind.TORN, FaultKind.POWER], workdir)
        cases += build_cases(["legacy"], [FaultKind.KILL], workdir)
        return cases + build_cases(["basic", "requests"], [], workdir, then_power=ThenPower.END)


DEFAULT_CASES = _default_cases()
STATES = StateCache()  # this process's verdicts by crash state


def test_the_default_slice_kills_a_legacy_session_at_every_boundary() -> None:
    kills = [c.at for c in DEFAULT_CASES if c.scenario == "legacy"]
    assert kills == list(range(1, len(kills) + 1))
    assert len(kills) >= 30


def test_the_default_slice_covers_every_boundary_of_the_basic_scenario() -> None:
    kills = [
        c
        for c in DEFAULT_CASES
        if c.scenario == "basic" and c.fault is FaultKind.KILL and c.power_at is None
    ]
    assert [c.at for c in kills] == list(range(1, len(kills) + 1))
    assert len(kills) >= 40
    assert {c.variant for c in DEFAULT_CASES if c.fault is FaultKind.POWER} == {
        "drop",
        "prefix",
        "zeros",
        "names",
    }
    assert {c.variant for c in DEFAULT_CASES if c.fault is FaultKind.TORN} == {
        "1byte",
        "half",
        "allbutlast",
        "lines",
    }


def test_the_default_slice_cuts_the_power_after_a_resume_from_every_kill(tmp_path: Path) -> None:
    for scenario in ("basic", "requests"):
        then_power = [c for c in DEFAULT_CASES if c.scenario == scenario and c.power_at == 0]
        kills = [c.at for c in then_power if c.fault is FaultKind.KILL]
        assert kills == list(range(1, len(clean_steps(scenario, str(tmp_path))) + 1))
        assert len([c for c in then_power if c.fault is FaultKind.IO]) >= 8


@pytest.mark.parametrize("case", DEFAULT_CASES, ids=[c.id for c in DEFAULT_CASES])
def test_the_store_survives_the_case_with_every_invariant_held(case: Case, tmp_path: Path) -> None:
    clean_steps(case.scenario, str(tmp_path))
    result = run_case(case, str(tmp_path), states=STATES)
    assert result.violations == [], f"replay: loopd chaos replay {case.id}"
    assert result.outcome == "ok"
    assert {
        "acknowledged-on-disk",
        "on-disk-acknowledged-or-in-flight",
        "keyed-request-complete",
        "single-writer",
        "no-key-twice",
        "one-epoch-end-last",
        "no-second-epoch-end-on-resume",
        "carry-is-recorded-summary",
        "call-numbers-unique",
        "epochs-contiguous-and-consistent",
        "final-state-opens",
    } <= set(result.checked)
