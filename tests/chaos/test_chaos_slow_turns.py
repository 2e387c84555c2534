"""The ``slow`` scenario: slow turns under a deadline, pipelined chunks, the poison probe.

Its mutants (progress-keeps-deadline, chunk-drops-last-request, deadline-never-armed,
poison-death-counted-twice) are caught on their pinned cases by tests/chaos/test_chaos_mutants.py.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from chaos.cases import Case
from chaos.oracle.oracle import ClientLog
from chaos.oracle.slow_checks import PROGRESS, judge_exit
from chaos.run.runner import clean_steps, run_case
from chaos.scenarios.scenarios import SCENARIOS

SLOW_CHECKS = {
    "progress-spares-turn",
    "pipelined-answered-in-order",
    "overdue-turn-ended",
    "poison-refused-after-deaths",
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case_id", ["slow:kill:-:5", "slow:kill:-:40"], ids=["create", "chunks"])
def test_the_real_store_passes_a_slow_case_and_every_slow_turn_check_is_made(
    case_id: str, tmp_path: Path
) -> None:
    clean_steps("slow", str(tmp_path))
    result = run_case(Case.parse(case_id), str(tmp_path))
    assert result.violations == [], result.notes
    assert set(result.checked) >= SLOW_CHECKS


def test_a_deadline_scenario_worker_ended_by_sigalrm_is_a_violation_and_sigkill_is_not() -> None:
    log = ClientLog()
    judge_exit(log, SCENARIOS["slow"], -signal.SIGKILL)
    assert log.problems == []
    judge_exit(log, SCENARIOS["slow"], -signal.SIGALRM)
    assert [invariant for invariant, _ in log.problems] == [PROGRESS]


def test_a_scenario_without_a_deadline_does_not_judge_its_workers_exit() -> None:
    log = ClientLog()
    judge_exit(log, SCENARIOS["requests"], -signal.SIGALRM)
    assert log.problems == []
    assert PROGRESS not in log.checks
