"""The rig at CI speed: crash-state deduplication, the stratified sample, progress and
reports written as the run goes, violations grouped by invariant and first cause."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from chaos.cases import Case, CaseResult
from chaos.faults.hook import FaultKind
from chaos.oracle.oracle import ClientLog
from chaos.report.html_report import render_html_report
from chaos.report.run_report import RunReport
from chaos.report.violation_groups import group_violations
from chaos.run.crash_states import state_key
from chaos.run.runner import clean_steps
from chaos.sweep.parallel import run_cases
from chaos.sweep.sampling import RECOVERY, SINGLE, THEN_POWER, compound_shape, plan_sample
from chaos.sweep.sweep import ALL_FAULTS, build_cases, faults_for
from tests.harness.support import poll_until

ROOT = Path(__file__).resolve().parents[2]
# Caught by one-epoch-end-last under kills of scenario basic (its quick selection).
MUTANT = "second-epoch-end-on-resume"


def _verdicts(results: list[CaseResult]) -> dict[str, tuple[str, frozenset[str]]]:
    """Each case's outcome and the invariants it broke (texts name each case's own home)."""
    return {r.case: (r.outcome, frozenset(v.split(":")[0] for v in r.violations)) for r in results}


@pytest.mark.timeout(110)
def test_dedupe_gives_every_case_the_verdict_of_checking_it_alone_and_still_catches_a_mutant(
    tmp_path: Path,
) -> None:
    cases = build_cases(["basic"], [FaultKind.KILL], str(tmp_path), mutant=MUTANT)
    (tmp_path / "alone").mkdir()
    (tmp_path / "shared").mkdir()
    shared = run_cases(cases, str(tmp_path / "shared"), jobs=1, on_result=lambda _r: None,
                       dedupe=True)  # fmt: skip
    # Every case that took another's verdict, and those others, checked alone.
    slice_ids = {r.case for r in shared if r.checked_by} | {r.checked_by for r in shared}
    again = [c for c in cases if c.id in slice_ids]
    alone = run_cases(again, str(tmp_path / "alone"), jobs=1, on_result=lambda _r: None,
                      dedupe=False)  # fmt: skip
    assert len(again) >= 10
    assert _verdicts(alone) == {k: v for k, v in _verdicts(shared).items() if k in slice_ids}
    caught = [r for r in shared if "one-epoch-end-last" in _verdicts([r])[r.case][1]]
    assert caught, "the mutant survived the deduplicated run"
    states = {r.state for r in shared}
    assert all(r.state for r in shared)
    assert len(states) < len(shared), "no two kills left the same crash state"
    borrowed = [r for r in shared if r.checked_by]
    assert borrowed
    assert all(r.checked_by != r.case for r in borrowed)
    assert any(r.checked_by and r.outcome == "violation" for r in shared)


def test_the_crash_state_key_sees_the_files_the_view_and_the_case_but_not_timestamps(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    log_file = home / "0.jsonl"
    log_file.write_text('{"type":"User","time":"2026-01-01T00:00:00.000001Z","key":"a"}\n')
    case = Case(scenario="basic", fault=FaultKind.KILL, at=3)
    log = ClientLog(acked={"a"})
    key = state_key(case, str(tmp_path), log)
    # Another boundary or fault kind that left the same files and view: the same state.
    other = dataclasses.replace(case, fault=FaultKind.IO, variant="eio", at=9)
    assert state_key(other, str(tmp_path), log) == key
    log_file.write_text('{"type":"User","time":"2026-05-05T11:11:11.999999Z","key":"a"}\n')
    assert state_key(case, str(tmp_path), log) == key
    assert state_key(case, str(tmp_path), ClientLog(acked={"a"}, in_flight={"b"})) != key
    assert state_key(case, str(tmp_path), ClientLog(acked={"a"}, started=True)) != key
    for changed in (
        dataclasses.replace(case, mutant=MUTANT),
        dataclasses.replace(case, recovery_at=2),
        dataclasses.replace(case, scenario="legacy"),
        dataclasses.replace(case, app="examples.notes_app:NotesApp"),
    ):
        assert state_key(changed, str(tmp_path), log) != key
    (tmp_path / "outside").mkdir()
    assert state_key(case, str(tmp_path), log) != key  # what an App wrote beside the home
    os.rmdir(tmp_path / "outside")
    log_file.write_text('{"type":"User","time":"2026-05-05T11:11:11.999999Z","key":"b"}\n')
    assert state_key(case, str(tmp_path), log) != key
    skip = frozenset({"worker.out"})
    before = state_key(case, str(tmp_path), log, skip=skip)
    (tmp_path / "worker.out").write_text("a worker's output is no input of the recovery")
    assert state_key(case, str(tmp_path), log, skip=skip) == before
    assert state_key(case, str(tmp_path), log) != before


def test_the_sample_covers_every_fault_kind_boundary_kind_and_compound_shape(
    tmp_path: Path,
) -> None:
    scenarios = ["basic", "requests"]
    plan = plan_sample(scenarios, list(ALL_FAULTS), str(tmp_path), seed=7, compound=True)
    first = plan.first(1)
    assert len(first) == plan.strata
    strata = {p.stratum for p in first}
    assert len(strata) == plan.strata  # one of each, none twice
    for name in scenarios:
        steps = {str(s["step"]) for s in clean_steps(name, str(tmp_path))}
        mine = [s for s in strata if s[0] == name]
        assert {s[2] for s in mine if s[3] == SINGLE} == steps
        assert {s[1] for s in mine} == {k.value for k in faults_for(name, ALL_FAULTS, None)}
        assert {s[3] for s in mine} == {SINGLE, RECOVERY, THEN_POWER}
    # Each stratum's variants take turns: its first V picks are its V variants.
    by_stratum: dict[tuple[str, ...], list[str]] = {}
    for pick in plan.picks:
        head = pick.case if pick.case is not None else pick.families[0]
        by_stratum.setdefault(pick.stratum, []).append(head.variant)
    assert any(len(set(v)) == 4 for v in by_stratum.values())  # power and torn at a write
    for variants in by_stratum.values():
        kinds = set(variants)
        assert set(variants[: len(kinds)]) == kinds
    again = plan_sample(scenarios, list(ALL_FAULTS), str(tmp_path), seed=7, compound=True)
    assert [p.stratum for p in again.picks] == [p.stratum for p in plan.picks]
    other = plan_sample(scenarios, list(ALL_FAULTS), str(tmp_path), seed=8, compound=True)
    assert [p.case for p in other.first(1)] != [p.case for p in first]


def test_chaos_run_with_a_sample_prints_its_seed_and_coverage_and_covers_every_fault_kind(
    tmp_path: Path,
) -> None:
    report, junit = tmp_path / "report.json", tmp_path / "report.xml"
    ran = subprocess.run(
        [sys.executable, "-m", "supervisor", "chaos", "run", "--scenario", "resume",
         "--sample", "10", "--seed", "5", "--jobs", "2", "--dir", str(tmp_path),
         "--json-report", str(report), "--junit-report", str(junit)],
        capture_output=True, text=True, timeout=100, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "sample: seed 5," in ran.stdout
    assert "again: loopd chaos run --seed 5 --sample 10" in ran.stdout
    assert "single-fault cases" in ran.stdout
    assert "every one covered" in ran.stdout
    data = json.loads(report.read_text())
    assert data["status"] == "finished"
    assert data["sample"]["seed"] == 5
    cases = [Case.parse(c["id"]) for c in data["cases"]]
    assert len(cases) >= data["sample"]["strata"] > 10
    assert {c.fault for c in cases} == set(faults_for("resume", ALL_FAULTS, None))
    assert {compound_shape(c) for c in cases} == {SINGLE, RECOVERY, THEN_POWER}
    assert data["distinct_states"] >= 1
    assert f"{len(cases)}/{len(cases)} cases, 0 violations" in ran.stderr  # not a tty: plain
    suite = ET.parse(junit).getroot()  # noqa: S314 - the rig's own file
    assert suite.tag == "testsuite"
    assert int(suite.get("tests", "0")) == len(suite.findall("testcase")) == len(cases)


@pytest.mark.timeout(110)
def test_the_json_report_is_valid_while_the_run_goes_and_survives_a_sigkill(
    tmp_path: Path,
) -> None:
    report = tmp_path / "report.json"
    html = tmp_path / "report.html"
    run = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "chaos", "run", "--scenario", "basic",
         "--no-compound", "--jobs", "1", "--dir", str(tmp_path), "--json-report", str(report),
         "--html-report", str(html)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip

    def written() -> bool:
        assert run.poll() is None, "the run ended before it wrote a report"
        return report.exists() and html.exists()  # the JSON report is written first

    try:
        poll_until(written, timeout=90, what="the run's first JSON and HTML reports")
        data = json.loads(report.read_text())
        assert data["status"] == "running"
        assert data["cases_done"] >= 1
        assert data["cases_planned"] > data["cases_done"]
        assert "the run is running" in html.read_text()
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=30)
    assert run.returncode == -signal.SIGKILL
    data = json.loads(report.read_text())  # the last complete report, never a torn one
    assert data["status"] == "running"
    assert len(data["cases"]) == data["cases_done"] >= 1


def _violating(case: str, detail: str) -> CaseResult:
    result = CaseResult(case=case, fault="kill", boundary="fsync 0.jsonl")
    result.violate("acknowledged-on-disk", detail)
    return result


def test_identical_violations_are_one_group_with_a_count_and_one_replay_line() -> None:
    results = [
        _violating("basic:kill:-:31:p4", "acknowledged keys lost by the crash: ['k3']"),
        _violating("basic:kill:-:9", "acknowledged keys lost by the crash: ['k1', 'k2']"),
        _violating("basic:kill:-:12:r2", "acknowledged keys lost by the crash: ['k2']"),
        _violating("basic:kill:-:40", "epoch 2 was acknowledged; the disk has 1"),
        CaseResult(case="basic:kill:-:1", fault="kill", boundary="mkdir sessions"),
    ]
    groups = group_violations(results)
    assert [(g.invariant, g.count) for g in groups] == [
        ("acknowledged-on-disk", 3),
        ("acknowledged-on-disk", 1),
    ]
    lost = groups[0]
    assert lost.example is not None
    assert lost.example.case == "basic:kill:-:9"  # the simplest case of the group
    assert lost.to_json()["replay"] == "loopd chaos replay basic:kill:-:9"
    assert "acknowledged keys lost by the crash" in lost.cause
    page = render_html_report(results, title="t", groups=groups)
    assert page.index("Violations by invariant and first cause") < page.index("<table>")
    assert page.count("&times; 3") == 1


@pytest.mark.timeout(115)
def test_the_pytest_plugin_runs_a_sample_covering_every_fault_kind_on_two_workers(
    tmp_path: Path,
) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\nloopd_chaos_sample = 1\n")
    junit = tmp_path / "junit.xml"
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(tmp_path / "pytest.ini"), "--rootdir",
         str(tmp_path), str(tmp_path), "-p", "no:cacheprovider",
         "--loopd-chaos=examples.notes_app:NotesApp", "--loopd-chaos-seed=3", "-k", "requests",
         "-n", "2", f"--junitxml={junit}"],
        capture_output=True, text=True, timeout=110, cwd=ROOT, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    names = [c.get("name", "") for c in ET.parse(junit).getroot().iter("testcase")]  # noqa: S314
    assert 10 < len(names) < 80
    faults = {name.split(":")[1] for name in names}
    assert faults == {k.value for k in faults_for("requests", ALL_FAULTS, None)}


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_redrawn_in_place_on_a_terminal_and_printed_plainly_elsewhere() -> None:
    now = [0.0]
    for stream, tty in ((_Terminal(), True), (io.StringIO(), False)):
        now[0] = 0.0
        report = RunReport(total=4, title="t", out=stream, clock=lambda: now[0])
        for n in range(4):
            now[0] = 6.0 * (n + 1)
            report.add(CaseResult(case=f"basic:kill:-:{n + 1}", fault="kill", boundary="-"))
        report.add(_violating("basic:kill:-:9", "acknowledged keys lost by the crash: ['k1']"))
        text = stream.getvalue()
        assert "VIOLATION basic:kill:-:9" in text
        assert "replay: loopd chaos replay basic:kill:-:9" in text
        if tty:
            assert text.count("\r") >= 4  # every case redraws the line
            assert "4/4 cases, 0 violations, 0.2 cases/s, ETA 0s" in text
        else:
            assert "\r" not in text
            lines = [line for line in text.splitlines() if " cases/s, ETA " in line]
            assert lines == ["2/4 cases, 0 violations, 0.2 cases/s, ETA 12s",
                             "4/4 cases, 0 violations, 0.2 cases/s, ETA 0s"]  # fmt: skip
