"""Effects outside the session: the rig's effects service and ``app-effects-once-per-key``.

A webhook posted without the request's key is posted again by the retry after a crash
that fell between the post and the durable note: the rig must say so, by that invariant
alone, with the line that replays the case. The agent, whose ``post_note`` sends the
key, posts again on the same retry and is answered with the first note: it passes.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.cases import Case, CaseResult
from chaos.faults.hook import FaultKind
from chaos.oracle.effects import INVARIANT, KEY_HEADER, journal_path, read_journal
from chaos.run.effects_service import EffectsService
from chaos.run.runner import run_case

ROOT = Path(__file__).resolve().parents[2]
WEBHOOK = "examples.broken_apps:WebhookNotesApp"
AGENT = "examples.agent_app:with_fake_model"
KEYLESS_AGENT = "tests.apps.effects_apps:keyless_tools_agent"
# requests:kill at the first write of q0's turn: the worker dies after the App sent its
# effect and before the turn is on disk, so the resumed worker handles q0 again. The
# boundary after it (the turn's fsync) leaves the turn on disk: the retry is answered
# from the log and sends nothing.
BETWEEN_POST_AND_NOTE = 15
AFTER_THE_NOTE = 16


def _case(app: str, at: int) -> Case:
    return Case(scenario="requests", fault=FaultKind.KILL, at=at, app=app)


def _invariants(result: CaseResult) -> set[str]:
    return {v.split(":")[0] for v in result.violations}


def _post(url: str, kind: str, key: str | None, body: bytes = b"{}") -> tuple[int, object]:
    port = int(url.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {KEY_HEADER: key} if key is not None else {}
    try:
        connection.request("POST", f"/{kind}", body=body, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_a_webhook_posted_without_the_request_key_is_caught_by_its_invariant_alone(
    tmp_path: Path,
) -> None:
    case = _case(WEBHOOK, BETWEEN_POST_AND_NOTE)
    result = run_case(case, str(tmp_path))
    assert _invariants(result) == {INVARIANT}, result.violations
    [violation] = result.violations
    assert violation.startswith(
        f"{INVARIANT}: request 'q0': 2 'webhook' effects applied where one attempt sends 1 "
        f"(2 without an {KEY_HEADER}, over 2 attempts)"
    )
    assert result.replay_line == (
        f"loopd chaos replay requests:kill:-:{BETWEEN_POST_AND_NOTE} --app {WEBHOOK}"
    )


def test_the_webhook_app_passes_a_crash_that_leaves_its_note_on_disk(tmp_path: Path) -> None:
    result = run_case(_case(WEBHOOK, AFTER_THE_NOTE), str(tmp_path))
    assert result.violations == []
    assert INVARIANT in result.checked
    posted = sorted(str(e.request) for e in read_journal(_journal(tmp_path)))
    assert posted == [f"q{n}" for n in range(6)]  # once per request: the retry found q0


def test_the_agent_posts_a_note_again_after_the_crash_and_the_key_keeps_it_once(
    tmp_path: Path,
) -> None:
    result = run_case(_case(AGENT, BETWEEN_POST_AND_NOTE), str(tmp_path))
    assert result.violations == []
    assert INVARIANT in result.checked
    q0 = [e for e in read_journal(_journal(tmp_path)) if e.request == "q0"]
    # The retry did post again (the crash fell after the tool ran): the service answered
    # it with the first note instead of keeping a second one.
    assert [(e.worker, e.applied, e.key) for e in q0] == [
        (1, True, "chaos/q0/1"),
        (2, False, "chaos/q0/1"),
    ]


def test_the_agent_whose_tools_lose_the_request_key_is_caught(tmp_path: Path) -> None:
    result = run_case(_case(KEYLESS_AGENT, BETWEEN_POST_AND_NOTE), str(tmp_path))
    assert _invariants(result) == {INVARIANT}, result.violations
    assert "request 'q0': 2 'notes' effects applied" in result.violations[0]


def test_chaos_replay_of_the_webhook_app_names_the_invariant_and_exits_1() -> None:
    case = f"requests:kill:-:{BETWEEN_POST_AND_NOTE}"
    ran = subprocess.run(
        [sys.executable, "-m", "supervisor", "chaos", "replay", case, "--app", WEBHOOK],
        capture_output=True, text=True, timeout=90, cwd=ROOT, check=False,
    )  # fmt: skip
    assert ran.returncode == 1, ran.stderr
    assert f"{INVARIANT}: request 'q0'" in ran.stdout
    assert ran.stdout.startswith(f"case       {case}\n")


def test_a_key_applied_before_a_crash_is_answered_with_the_first_effect_by_the_next_service(
    tmp_path: Path,
) -> None:
    home = str(tmp_path / "home")
    first = EffectsService.start(home)
    try:
        first.sent({"op": "request", "request": {"text": "t", "key": "q0"}})
        assert _post(first.url, "notes", "s/q0/1") == (201, {"id": 1, "kind": "notes"})
        assert _post(first.url, "notes", None) == (201, {"id": 2, "kind": "notes"})
    finally:
        first.stop()
    second = EffectsService.start(home)
    try:
        second.sent({"op": "request", "request": {"text": "t", "key": "q0"}})
        assert _post(second.url, "notes", "s/q0/1") == (200, {"id": 1, "kind": "notes"})
        assert _post(second.url, "webhook", None) == (201, {"id": 1, "kind": "webhook"})
    finally:
        second.stop()
    effects = read_journal(journal_path(home))
    assert [(e.worker, e.request, e.kind, e.key, e.applied) for e in effects] == [
        (1, "q0", "notes", "s/q0/1", True),
        (1, "q0", "notes", None, True),
        (2, "q0", "notes", "s/q0/1", False),
        (2, "q0", "webhook", None, True),
    ]


def test_an_effect_cut_short_by_the_senders_death_is_not_applied(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    service = EffectsService.start(home)
    try:
        port = int(service.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sender:
            sender.sendall(b"POST /notes HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
        assert _post(service.url, "notes", "k")[0] == 201  # answered after the cut one
    finally:
        service.stop()
    assert [e.key for e in read_journal(journal_path(home))] == ["k"]


def test_the_service_stops_with_its_backlog_answered_and_leaves_no_process(
    tmp_path: Path,
) -> None:
    service = EffectsService.start(str(tmp_path / "home"))
    service.stop()
    with pytest.raises(ChildProcessError):
        os.waitpid(service.pid, os.WNOHANG)  # reaped: no process of it is left
    with pytest.raises(ConnectionRefusedError):
        _post(service.url, "notes", "k")


def _journal(workdir: Path) -> str:
    [case] = [p for p in workdir.iterdir() if p.name.startswith("case-")]
    return journal_path(str(case / "home"))
