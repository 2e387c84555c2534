"""A budget is a budget: `loopd chaos run --budget` and the pytest plugin stop once it is
spent, run the cheap strata first, and list (not run, not skip) what they left."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from chaos.faults.hook import FaultKind
from chaos.sweep.sampling import SHAPE_COST, plan_sample

ROOT = Path(__file__).resolve().parents[2]


def test_every_round_of_a_sample_runs_its_single_fault_strata_before_the_compound_ones(
    tmp_path: Path,
) -> None:
    plan = plan_sample(["basic", "requests"], [FaultKind.KILL, FaultKind.POWER], str(tmp_path),
                       seed=11, compound=True)  # fmt: skip
    first = plan.first(1)
    costs = [SHAPE_COST[pick.shape] for pick in first]
    assert costs == sorted(costs)
    assert len(set(costs)) == 3  # single, then power after a resume, then recovery kills
    assert plan.unreached(len(first)) == []
    assert plan.unreached(0) == [pick.stratum for pick in first]


def test_a_budgeted_run_stops_once_its_budget_is_spent_and_lists_the_strata_it_left(
    tmp_path: Path,
) -> None:
    report = tmp_path / "report.json"
    ran = subprocess.run(
        [sys.executable, "-m", "supervisor", "chaos", "run", "--budget", "1", "--jobs", "2",
         "--seed", "3", "--dir", str(tmp_path), "--json-report", str(report)],
        capture_output=True, text=True, timeout=100, cwd=ROOT, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    document = json.loads(report.read_text())
    strata = document["sample"]["strata"]
    left = document["sample"]["not_reached"]
    # Before, the whole first round ran (every stratum once) however small the budget.
    assert document["cases_done"] < strata
    assert left
    assert len(left) + document["cases_done"] >= strata
    assert "not reached within the budget of 1 s: " in ran.stdout
    assert f"of {strata} strata covered, {len(left)} not reached" in ran.stdout
    assert all(name.endswith(":single") for name in left[: strata // 4]) or all(
        not name.endswith(":single") for name in left
    )  # the cheap strata were started first: any single-fault stratum left comes first


@pytest.mark.timeout(115)
def test_the_pytest_plugin_leaves_the_items_past_its_budget_unrun_and_unreported(
    tmp_path: Path,
) -> None:
    junit = tmp_path / "junit.xml"
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(tmp_path / "pytest.ini"), "--rootdir",
         str(tmp_path), str(tmp_path), "-p", "no:cacheprovider", "-p", "no:xdist",
         "--loopd-chaos=examples.notes_app:NotesApp", "--loopd-chaos-seed=3",
         "--loopd-chaos-budget=0.001", "--loopd-chaos-faults=kill",
         f"--junitxml={junit}"],
        capture_output=True, text=True, timeout=110, cwd=ROOT, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    cases = list(ET.parse(junit).getroot().iter("testcase"))  # noqa: S314 - our own file
    assert [c for c in cases if c.find("skipped") is not None] == []
    assert "sampled cases not reached within the budget of 0.001 s" in ran.stdout
