"""Salvage under the rig (issue 31): the ``salvage`` scenario's cases against the real
store, and its checks against a salvage that loses what it cuts. The mutants of
salvage run in tests/chaos/test_chaos_mutants.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chaos.cases import Case, CaseResult
from chaos.oracle.salvage_checks import KEEPS, final
from chaos.run.runner import clean_steps, run_case
from chaos.run.worker_run import STORE_ERRORS
from chaos.scenarios.salvage_tool import ORIGINAL, prepare_damaged, quarantine_dir, victim_dir
from worker.offline.salvage import salvage_session
from worker.store.errors import LogError
from worker.store.loader import load_session

# What the scenario's first runs found in salvage, each case the one that showed it:
CASES = [
    # The fsync of the home after salvage made quarantine/ failed (or salvage was killed
    # there); the rerun found quarantine/ and never made its name durable: a power loss
    # took the quarantine away with the epochs moved into it.
    "salvage:io:eio:18:pend",
    "salvage:kill:-:18:pend",
    # The fsync after the plan's move into the quarantine failed; the rerun said nothing
    # was left to salvage, and a power loss brought the plan back into the session.
    "salvage:io:eio:51:pend",
    "salvage:io:eio:51:p1",
    # A full file system while salvage built its candidate: a bare OSError escaped.
    "salvage:short:fsize:46",
    # A kill in each step of salvage: the plan, the moves, the cut lines, the truncation.
    "salvage:kill:-:26",
    "salvage:kill:-:33",
    "salvage:kill:-:40",
    "salvage:kill:-:44",
    "salvage:power:drop:45",
    "salvage:power:names:50",
]


@pytest.mark.timeout(120)
def test_the_real_store_holds_every_salvage_cut_short(tmp_path: Path) -> None:
    steps = clean_steps("salvage", str(tmp_path))
    assert len(steps) == 54, len(steps)  # the cases here and the pinned ones count on it
    for case_id in CASES:
        result = run_case(Case.parse(case_id), str(tmp_path))
        assert result.outcome == "ok", (case_id, result.violations, result.notes)
        assert {KEEPS, STORE_ERRORS} <= set(result.checked), (case_id, result.checked)


def test_the_prepared_victim_is_refused_at_its_damaged_line_and_salvage_keeps_a_prefix(
    tmp_path: Path,
) -> None:
    home = str(tmp_path)
    prepare_damaged(home)
    with pytest.raises(LogError) as refused:
        load_session(victim_dir(home), "victim", history=True)
    assert refused.value.path.endswith("1.jsonl"), refused.value
    result = salvage_session(os.path.join(home, "damaged"), "victim")
    assert (result.kept_epoch, result.kept_bytes > 0) == (1, True), result
    state = load_session(victim_dir(home), "victim", history=True)
    assert state.epoch == 1
    assert sorted(os.listdir(os.path.join(home, ORIGINAL))) != []
    assert os.listdir(quarantine_dir(home)), "what salvage cut is in quarantine"


def test_a_salvage_that_drops_what_it_cuts_is_caught(tmp_path: Path) -> None:
    # The lines salvage cuts from the damaged log never reach the quarantine: the check
    # must say so once the salvage has run.
    home = str(tmp_path)
    prepare_damaged(home)
    salvage_session(os.path.join(home, "damaged"), "victim")
    verdict = CaseResult(case="salvage:kill:-:53", fault="kill", boundary="-")
    final(verdict, home)
    assert verdict.outcome == "ok", verdict.violations
    for entry in os.listdir(quarantine_dir(home)):
        (Path(quarantine_dir(home)) / entry / "1.jsonl.cut").unlink()
    verdict = CaseResult(case="salvage:kill:-:53", fault="kill", boundary="-")
    final(verdict, home)
    assert [v for v in verdict.violations if v.startswith(f"{KEEPS}: bytes of 1.jsonl")], (
        verdict.violations
    )
