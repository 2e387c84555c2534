"""The rig's streaming and pipelined scenarios (issue 31): partials reach their own
request in order and start again after a death; a key carried twice in one batch is
applied once and answered alike."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from chaos.cases import Case
from chaos.oracle.batch_checks import REPEATED, STREAM, Attempt, judge_batch, judge_stream
from chaos.oracle.oracle import ClientLog
from chaos.run.runner import AppScenarioError, clean_steps, run_case, scenario_for
from chaos.scenarios.stream_app import pieces

TEXT = "streamed request 0 " + "v" * 20


def _applied(call: int = 1, *, duplicate: bool = False) -> dict[str, object]:
    return {"duplicate": duplicate, "call": call, "text": f"echo: {TEXT}"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "case_id",
    [
        "streaming:kill:-:16",  # the pair's partials sent, the worker dies at its fsync
        "streaming:torn:half:17",  # the second pair's write torn after its partials
        "streaming:io:eio:16",  # the pair refused after its partials, then sent again
        "pipelined:io:eio:15",  # the pair's group fails; the repeated key is applied
        "pipelined:kill:-:22",  # a death in the epoch commit inside the second batch
        "pipelined:power:drop:36",  # the group of the repeated key after the commit
    ],
)
def test_the_real_store_holds_the_case_and_its_own_invariant_is_checked(
    case_id: str, tmp_path: Path
) -> None:
    case = Case.parse(case_id)
    clean_steps(case.scenario, str(tmp_path))
    result = run_case(case, str(tmp_path))
    assert (result.outcome, result.violations) == ("ok", [])
    assert (STREAM if case.scenario == "streaming" else REPEATED) in result.checked


@pytest.mark.parametrize("name", ["partial-to-first-request", "partials-sent-newest-first"])
def test_a_streaming_mutant_is_caught_by_its_invariant_alone(name: str, tmp_path: Path) -> None:
    case = dataclasses.replace(Case.parse("streaming:kill:-:16"), mutant=name)
    clean_steps(case.scenario, str(tmp_path))
    result = run_case(case, str(tmp_path))
    assert result.violations
    assert all(v.startswith(f"{STREAM}:") for v in result.violations), result.violations


def test_the_scenarios_with_their_own_client_and_app_host_no_user_app() -> None:
    for name in ("streaming", "pipelined"):
        with pytest.raises(AppScenarioError, match="rig's own app"):
            scenario_for(name, "examples.notes_app:NotesApp")


def test_partials_cut_by_a_death_then_sent_whole_again_hold() -> None:
    log = ClientLog()
    judge_stream(log, Attempt(key="s0", text=TEXT, partials=pieces(TEXT)[:2]), died=True)
    again = Attempt(key="s0", text=TEXT, partials=pieces(TEXT), result=_applied())
    judge_stream(log, again)
    assert log.problems == []


def test_a_partial_of_another_request_is_reported() -> None:
    log = ClientLog()
    other = pieces("streamed request 1 " + "v" * 20)
    attempt = Attempt(key="s0", text=TEXT, partials=[*pieces(TEXT), other[0]], result=_applied())
    judge_stream(log, attempt)
    assert [name for name, _ in log.problems] == [STREAM]


def test_a_restarted_stream_that_goes_on_from_where_it_was_cut_is_reported() -> None:
    log = ClientLog()
    judge_stream(log, Attempt(key="s0", text=TEXT, partials=pieces(TEXT)[1:]), died=True)
    assert [name for name, _ in log.problems] == [STREAM]
    assert "before its worker died" in log.problems[0][1]


def test_a_key_refused_then_found_applied_in_one_batch_is_reported() -> None:
    log = ClientLog()
    refused = Attempt(key="p0", text=TEXT, code="SessionIOError", answered=True)
    found = Attempt(key="p0", text=TEXT, result=_applied(duplicate=True), answered=True)
    judge_batch(log, [refused, found])
    assert log.problems == [(REPEATED, "'p0' was refused, then found applied, in one batch")]


def test_a_key_refused_by_a_failed_write_then_applied_by_the_same_batch_holds() -> None:
    log = ClientLog()
    refused = Attempt(key="p0", text=TEXT, code="SessionIOError", answered=True)
    applied = Attempt(key="p0", text=TEXT, result=_applied(), answered=True)
    judge_batch(log, [refused, applied])
    assert log.problems == []


def test_a_repeated_key_answered_with_another_call_is_reported() -> None:
    log = ClientLog()
    first = Attempt(key="p0", text=TEXT, result=_applied(1), answered=True)
    second = Attempt(key="p0", text=TEXT, result=_applied(2, duplicate=True), answered=True)
    judge_batch(log, [first, second])
    assert log.problems == [
        (REPEATED, "'p0' was answered unlike its first answer: {'call': (1, 2)}")
    ]
