"""The rig through a user's App: the contract checks, --app, the pytest plugin, --seed, HTML.

The worked example (``examples.notes_app:NotesApp``) must hold every invariant and the
App contract; each deliberately broken example (``examples.broken_apps``) must be
reported, with the line that replays it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.cases import Case, CaseResult
from chaos.faults.hook import FaultKind
from chaos.report.html_report import render_html_report
from chaos.run import supervised
from chaos.run.runner import run_case
from chaos.sweep.sweep import build_cases

ROOT = Path(__file__).resolve().parents[2]
NOTES = "examples.notes_app:NotesApp"
BROKEN = "examples.broken_apps"


def _run(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """A command of this interpreter, from the project's root (where ``examples`` is)."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, check=False)  # fmt: skip


def test_the_worked_example_app_holds_every_invariant_and_the_contract(tmp_path: Path) -> None:
    faults = [FaultKind.KILL, FaultKind.TORN, FaultKind.POWER, FaultKind.IO, FaultKind.SHORT]
    cases = build_cases(["requests", "operator"], faults, str(tmp_path), app=NOTES)
    sample = cases[::60]
    assert {c.fault for c in sample} >= {FaultKind.KILL, FaultKind.POWER, FaultKind.IO}
    for case in sample:
        result = run_case(case, str(tmp_path))
        assert result.violations == [], case.id
        assert {"app-retry-applied-once", "app-writes-only-its-session"} <= set(result.checked)


def test_an_app_whose_summaries_never_repeat_holds_the_contract(tmp_path: Path) -> None:
    # A model-written summary is never the same twice; the store records it in EpochEnd
    # before anything depends on it, and a resume uses the recorded one.
    app = "chaos.scenarios.apps:UnrepeatableSummaryApp"
    cases = build_cases(["requests", "operator"], [FaultKind.KILL, FaultKind.POWER],
                        str(tmp_path), app=app)  # fmt: skip
    sample = cases[::25]
    assert len(sample) >= 10
    for case in sample:
        result = run_case(case, str(tmp_path))
        assert result.violations == [], case.id
        assert {"app-resume-deterministic", "app-resume-uses-recorded-summary"} <= set(
            result.checked
        )


@pytest.mark.parametrize(
    ("app", "invariant"),
    [
        ("TwiceNotesApp", "app-retry-applied-once"),
        ("SplitNotesApp", "app-request-all-or-nothing"),
        ("DriftingNotesApp", "app-resume-deterministic"),
        ("ResummarizingNotesApp", "app-resume-uses-recorded-summary"),
        ("LitteringNotesApp", "app-writes-only-its-session"),
    ],
    ids=["applied-twice", "two-appends", "baseline-by-pid", "summary-again", "file-in-cwd"],
)
def test_the_contract_check_reports_each_broken_example_app(
    app: str, invariant: str, tmp_path: Path
) -> None:
    case = Case(scenario="requests", fault=FaultKind.KILL, at=30, app=f"{BROKEN}:{app}")
    result = run_case(case, str(tmp_path))
    assert invariant in {v.split(":")[0] for v in result.violations}
    assert result.replay_line == f"loopd chaos replay requests:kill:-:30 --app {BROKEN}:{app}"


def test_a_crash_between_two_appends_of_one_request_leaves_it_incomplete(tmp_path: Path) -> None:
    app = f"{BROKEN}:SplitNotesApp"
    cases = build_cases(["requests"], [FaultKind.KILL], str(tmp_path), app=app)
    found = [v for c in cases[10:30] for v in run_case(c, str(tmp_path)).violations]
    assert any(v.startswith("keyed-request-complete: request 'q") for v in found)


def test_chaos_run_with_an_app_writes_an_html_report_and_exits_0(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    ran = _run("-m", "supervisor", "chaos", "run", "--app", NOTES, "--scenario", "requests",
               "--faults", "short", "--no-compound", "--jobs", "2",
               "--html-report", str(page))  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    text = page.read_text()
    assert "<table>" in text
    assert "<script" not in text
    assert "loopd chaos replay requests:short:fsize:" in text
    assert f"--app {NOTES}" in text


def test_chaos_replay_of_a_broken_app_names_the_app_and_exits_1() -> None:
    ran = _run("-m", "supervisor", "chaos", "replay", "requests:kill:-:30",
               "--app", f"{BROKEN}:TwiceNotesApp")  # fmt: skip
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "VIOLATION  app-retry-applied-once: requests sent again" in ran.stdout


def test_chaos_run_refuses_an_app_in_a_scenario_that_drives_the_store() -> None:
    ran = _run("-m", "supervisor", "chaos", "run", "--app", NOTES, "--scenario", "basic")
    assert ran.returncode == 2
    assert "scenario basic drives the store directly: it hosts no app" in ran.stderr


def _plugin_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest with only the plugin's items: an empty rootdir of its own, no project tests."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return _run("-m", "pytest", "-c", str(tmp_path / "pytest.ini"), "--rootdir",
                str(tmp_path), str(tmp_path), "-p", "no:cacheprovider", *args,
                timeout=110)  # fmt: skip


def test_the_pytest_plugin_runs_the_worked_example_as_sharded_items(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    ran = _plugin_run(tmp_path, f"--loopd-chaos={NOTES}", "-k", "requests and (short or "
                      "torn:half)", "-n", "2", f"--junitxml={junit}")  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    assert " passed" in ran.stdout
    xml = junit.read_text()
    assert 10 < xml.count("<testcase ") <= 40
    assert f'classname="loopd-chaos[{NOTES}]" name="requests:torn:half:' in xml


def test_the_pytest_plugin_reports_a_keyed_request_applied_twice_with_its_replay_line(
    tmp_path: Path,
) -> None:
    junit = tmp_path / "junit.xml"
    app = f"{BROKEN}:TwiceNotesApp"
    ran = _plugin_run(tmp_path, f"--loopd-chaos={app}", "-k", "requests:kill:-:30",
                      f"--junitxml={junit}")  # fmt: skip
    assert ran.returncode == 1, ran.stdout[-3000:] + ran.stderr[-2000:]
    assert "1 failed" in ran.stdout
    assert "app-retry-applied-once: requests sent again with the same key" in ran.stdout
    assert f"replay: loopd chaos replay requests:kill:-:30 --app {app}" in ran.stdout
    assert "<failure" in junit.read_text()


def test_the_pytest_plugin_adds_nothing_without_its_option(tmp_path: Path) -> None:
    ran = _plugin_run(tmp_path, "--collect-only", "-q")
    assert ran.returncode == 5, ran.stdout + ran.stderr  # no tests collected
    assert "loopd-chaos" not in ran.stdout


def test_supervised_chaos_prints_its_seed_and_runs_the_users_app() -> None:
    ran = _run("-m", "supervisor", "chaos", "supervised", "--sessions", "2", "--requests",
               "40", "--duration", "60", "--seed", "11", "--app", NOTES)  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.startswith("seed: 11\n")
    assert "80 requests acknowledged" in ran.stdout


def test_a_supervised_worker_draws_its_kills_from_seed_session_and_incarnation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(supervised.SCHEDULE_ENV, str(tmp_path))
    assert [supervised.incarnation("s1") for _ in range(3)] == ["s1:0", "s1:1", "s1:2"]
    assert supervised.incarnation("s2") == "s2:0"
    assert sorted(os.listdir(tmp_path)) == ["s1.0", "s1.1", "s1.2", "s2.0"]
    assert supervised.session_of("/h/sessions/s1/0.jsonl") == "s1"
    assert supervised.session_of("/h/sessions/s1") == "s1"
    assert supervised.session_of("/h/sessions") is None


def test_the_html_report_colours_each_cell_and_links_it_to_the_replay_line() -> None:
    ok = CaseResult(case="requests:kill:-:3", fault="kill", boundary="fsync 0.jsonl", app=NOTES)
    bad = CaseResult(case="requests:kill:-:4", fault="kill", boundary="write 0.jsonl", app=NOTES)
    bad.violate("no-key-twice", "applied more than once: ['q1']")
    page = render_html_report([ok, bad], title="t")
    assert "<td class='ok'><a href='#case-requests_kill___3'" in page
    assert "<td class='bad'><a href='#case-requests_kill___4'" in page
    assert "<li id='case-requests_kill___4' class='bad'>" in page
    assert f"loopd chaos replay requests:kill:-:4 --app {NOTES}" in page
    assert "no-key-twice: applied more than once: [&#x27;q1&#x27;]" in page
