"""The worked agent App and its fake model: real servers, a real ``loopd serve``, SIGKILLs.

The fake model runs as ``python -m examples.fake_model`` (a process of its own, as in
CI); the agent is hosted with ``loopd serve --app examples.agent_app:AgentApp`` and
finds the model through ``LOOPD_AGENT_URL``.
"""

from __future__ import annotations

import http.client
import json
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.cases import Case, ThenPower
from chaos.faults.hook import FaultKind
from chaos.run.runner import run_case
from chaos.sweep.sweep import build_cases
from examples.agent_app import AgentApp, AgentConfig, TurnFailed
from examples.chat_client import ChatClient
from supervisor.client import Client, call
from tests.apps.agent_apps import DEATH_MARKER_ENV
from tests.harness.support import REPO, poll_until, running_daemon, status
from worker.store.session import Session

AGENT = "examples.agent_app:AgentApp"
RIG_AGENT = "examples.agent_app:with_fake_model"


class FakeModel:
    """``python -m examples.fake_model`` on a free port, stopped and reaped at the end."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "examples.fake_model", "--port", "0", *args],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        assert ready, "the fake model printed no port within 30 s"
        self.port = int(self.proc.stdout.readline())
        self.url = f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> dict[str, object]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.request("GET", path)
            document = json.loads(connection.getresponse().read())
        finally:
            connection.close()
        assert isinstance(document, dict)
        return document

    def post(self, path: str, body: dict[str, object]) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.request("POST", path, body=json.dumps(body).encode())
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def fake_model() -> Iterator[FakeModel]:
    model = FakeModel("--delay", "0")
    try:
        yield model
    finally:
        model.stop()


def _records(home: Path, session: str) -> list[dict[str, object]]:
    """Every record of every epoch of ``session``, in order, read from the files."""
    directory = home / "sessions" / session
    records = []
    for log in sorted(directory.glob("*.jsonl"), key=lambda p: int(p.name.split(".")[0])):
        records += [json.loads(line) for line in log.read_bytes().splitlines()]
    return records


def _chat(model: FakeModel, stream: bool) -> ChatClient:
    return ChatClient(base_url=model.url, model="fake", timeout=10, stream=stream)


def test_the_fake_model_prints_its_port_and_streams_a_tool_call_then_an_answer(
    fake_model: FakeModel,
) -> None:
    tools = [{"type": "function", "function": {"name": "calculate"}}]
    asked: list[dict[str, object]] = [{"role": "user", "content": "what is 6 * 7?"}]
    pieces: list[str] = []
    for stream in (True, False):
        call_reply = _chat(fake_model, stream).complete(asked, tools=tools)
        assert call_reply.content == ""
        [tool_call] = call_reply.tool_calls
        assert (tool_call.name, json.loads(tool_call.arguments)) == (
            "calculate",
            {"expression": "6 * 7"},
        )
        assert call_reply.usage.prompt_tokens > 0
        answered: list[dict[str, object]] = [
            *asked,
            {"role": "assistant", "content": None, "tool_calls": []},
            {"role": "tool", "tool_call_id": tool_call.id, "content": "42"},
        ]
        answer = _chat(fake_model, stream).complete(answered, tools=tools, on_token=pieces.append)
        assert answer.content.startswith("Done ")
        assert answer.content.endswith(": 42")
        assert answer.usage.completion_tokens > 0
    assert len(pieces) > 3  # the streamed answer came a word at a time, the whole one at once
    stats = fake_model.get("/fake/stats")
    assert (stats["completions"], stats["streamed"]) == (4, 2)
    assert fake_model.get("/v1/models")["data"] == [{"id": "fake", "object": "model"}]


def test_the_fake_models_wording_varies_per_call_unless_told_not_to_or_seeded() -> None:
    asked = [{"role": "user", "content": "hello"}]
    models = [FakeModel("--delay", "0"), FakeModel("--delay", "0", "--no-vary"),
              *(FakeModel("--delay", "0", "--seed", "7") for _ in range(2))]  # fmt: skip
    try:
        texts = [[_chat(m, False).complete(asked).content for _ in range(2)] for m in models]
    finally:
        for model in models:
            model.stop()
    varied, same, seeded, seeded_again = texts
    assert varied[0] != varied[1]
    assert len(varied[0]) == len(varied[1])  # the same token counts: epochs change alike
    assert same[0] == same[1]
    assert seeded[0] != seeded[1]
    assert seeded == seeded_again


def test_the_fake_model_waits_its_delay_before_it_answers() -> None:
    model = FakeModel("--delay", "0.5-0.6")
    try:
        started = time.monotonic()
        _chat(model, True).complete([{"role": "user", "content": "hi"}])
        assert time.monotonic() - started >= 0.5
    finally:
        model.stop()


def test_the_fake_model_refuses_a_bad_delay_in_one_line() -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "examples.fake_model", "--delay", "2-1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert ran.returncode == 2
    assert "argument --delay: delay must be 0 <= A <= B, got '2-1'" in ran.stderr
    assert "Traceback" not in ran.stderr


def test_the_agent_config_names_a_bad_environment_variable() -> None:
    with pytest.raises(
        ValueError, match=r"^LOOPD_AGENT_TIMEOUT must be seconds above 0, got 'soon'$"
    ):
        AgentConfig.from_env({"LOOPD_AGENT_TIMEOUT": "soon"})
    with pytest.raises(ValueError, match=r"^LOOPD_AGENT_URL: model endpoint 'ftp://h' is not"):
        AgentConfig.from_env({"LOOPD_AGENT_URL": "ftp://h"})
    assert AgentConfig.from_env({}).chat.base_url == "http://127.0.0.1:8080"


def test_an_unreachable_model_refuses_the_turn_and_writes_nothing(tmp_path: Path) -> None:
    config = AgentConfig.from_env(
        {"LOOPD_AGENT_URL": "http://127.0.0.1:9", "LOOPD_AGENT_TIMEOUT": "5"}
    )
    app = AgentApp(4000, config)
    with Session.create(tmp_path, "s1", app.initial_baseline("s1")) as session:
        with pytest.raises(
            TurnFailed,
            match=r"^turn 'k1' failed, nothing was written: "
            r"http://127\.0\.0\.1:9/v1/chat/completions: cannot reach the model",
        ):
            app.handle(session, {"text": "hi", "key": "k1"})
        assert len(session.records) == 1  # the SessionStart alone
        # The summary of an epoch does not wait for a model that is down.
        assert app.summarize(session).startswith("(no model summary: http://127.0.0.1:9/")


def _send(home: Path, text: str, key: str) -> dict[str, object]:
    with Client(str(home), timeout=60) as client:
        return client.send("s1", text, key=key)


def test_a_turn_through_loopd_serve_runs_its_tools_records_its_usage_and_a_retry_is_a_duplicate(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    model = FakeModel("--delay", "0.5-1")  # a model that takes its time, as real ones do
    env = {"LOOPD_AGENT_URL": model.url, "LOOPD_AGENT_NOTES_URL": f"{model.url}/fake/notes"}
    try:
        with running_daemon(home, "--app", AGENT, env=env):
            call(str(home), "create", session="s1")
            first = _send(home, "what is 12 * 7? note: lunch at noon", "t1")
            served = model.get("/fake/stats")["completions"]
            again = _send(home, "what is 12 * 7? note: lunch at noon", "t1")
            assert model.get("/fake/stats")["completions"] == served  # the model is not asked
            notes = model.get("/fake/notes")["notes"]
    finally:
        model.stop()
    assert first["duplicate"] is False
    assert [(t["tool"], t["output"], t["ok"]) for t in first["tools"]] == [  # type: ignore[attr-defined]
        ("calculate", "84", True), ("post_note", "note 1 kept", True),
    ]  # fmt: skip
    assert str(first["text"]).endswith(": 84; note 1 kept")
    assert again["duplicate"] is True
    assert {k: again[k] for k in ("text", "tools", "usage")} == {
        k: first[k] for k in ("text", "tools", "usage")
    }
    assert notes == [{"id": 1, "text": "lunch at noon", "key": "s1/t1/2"}]
    records = [r for r in _records(home, "s1") if r["type"] != "SessionStart"]
    assert [r["type"] for r in records] == [
        "User",
        "ToolResult",
        "ToolResult",
        "Assistant",
        "Usage",
    ]
    assert [(r["part"], r["parts"]) for r in records] == [(i, 5) for i in range(1, 6)]  # one group
    usage = records[-1]
    assert usage["prompt_tokens"] == first["usage"]["prompt_tokens"] > 0  # type: ignore[index]
    assert int(str(usage["completion_tokens"])) > 0
    assert records[0]["key"] == "t1"


def test_a_model_written_summary_closes_the_epoch_and_a_restarted_worker_gives_it_to_the_model(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--app", AGENT, "--budget", "50",
                        env={"LOOPD_AGENT_URL": fake_model.url}):  # fmt: skip
        call(str(home), "create", session="s1")
        first = _send(home, "remember the blue door", "t1")
        assert first["committed"] is True, repr(first)  # the context passed 50 tokens
        summaries = int(str(fake_model.get("/fake/stats")["summaries"]))
        call(str(home), "restart", session="s1")
        poll_until(lambda: status(home, "s1")["state"] == "RUNNING", what="the restart")
        again = _send(home, "remember the blue door", "t1")  # from the closed epoch 0's log
        _send(home, "what was the door like?", "t2")
        seen = fake_model.get("/fake/last")["messages"]
        assert fake_model.get("/fake/stats")["summaries"] == summaries + 1  # t2's commit only
    [closing] = [r for r in _records(home, "s1") if r["type"] == "EpochEnd"][:1]
    summary = str(closing["summary"])
    assert summary.startswith("Summary ")
    assert "remember the blue door" in summary
    baseline = json.loads((home / "sessions" / "s1" / "1.baseline.json").read_bytes())
    assert baseline["memory"] == summary
    assert isinstance(seen, list)
    assert summary in str(seen[0]["content"])  # the model was given it as its memory
    assert again["duplicate"] is True
    assert (again["epoch"], again["text"], again["usage"]) == (0, first["text"], first["usage"])


def test_a_turn_whose_worker_is_sigkilled_after_its_tools_ran_posts_its_note_once_on_retry(
    tmp_path: Path, fake_model: FakeModel
) -> None:
    home = tmp_path / "home"
    marker = tmp_path / "died"
    env = {"LOOPD_AGENT_URL": fake_model.url, DEATH_MARKER_ENV: str(marker),
           "LOOPD_AGENT_NOTES_URL": f"{fake_model.url}/fake/notes"}  # fmt: skip
    with running_daemon(home, "--app", "tests.apps.agent_apps:ToolsThenDeathAgent", env=env):
        call(str(home), "create", session="s1")
        reply = _send(home, "note: water the plants", "n1")
        assert marker.exists()  # the first worker died after posting, before writing
        assert status(home, "s1")["restarts"] == 1
    assert reply["duplicate"] is False
    assert reply["tools"] == [{"call": 1, "tool": "post_note", "output": "note 1 kept", "ok": True}]
    notes = fake_model.get("/fake/notes")["notes"]
    assert notes == [{"id": 1, "text": "water the plants", "key": "s1/n1/1"}]
    assert [r.get("key") for r in _records(home, "s1") if r["type"] == "User"] == ["n1"]


def test_the_agent_app_holds_every_invariant_and_the_contract_on_a_slice_of_every_fault(
    tmp_path: Path,
) -> None:
    faults = [FaultKind.KILL, FaultKind.TORN, FaultKind.POWER, FaultKind.IO, FaultKind.SHORT]
    cases = build_cases(["requests", "operator"], faults, str(tmp_path), app=RIG_AGENT,
                        then_power=ThenPower.END)  # fmt: skip
    # About six cases of each fault kind (and of the power loss after a resume), spread
    # over the boundaries; `loopd chaos run --app` runs them all (docs/apps.md).
    groups: dict[tuple[FaultKind, bool], list[Case]] = {}
    for case in cases:
        groups.setdefault((case.fault, case.power_at is not None), []).append(case)
    sample = [c for group in groups.values() for c in group[:: max(1, len(group) // 6)]]
    assert {c.fault for c in sample} == set(faults)
    assert any(c.power_at is not None for c in sample)
    for case in sample:
        result = run_case(case, str(tmp_path))
        assert result.violations == [], case.id
        assert {"app-resume-deterministic", "app-resume-uses-recorded-summary",
                "app-retry-applied-once"} <= set(result.checked)  # fmt: skip


def test_the_agent_streams_the_models_tokens_before_its_reply_through_loopd_serve(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    model = FakeModel("--delay", "0.2-0.4")
    env = {"LOOPD_AGENT_URL": model.url, "LOOPD_AGENT_NOTES_URL": f"{model.url}/fake/notes"}
    try:
        with running_daemon(home, "--app", AGENT, "--hang-timeout", "3", env=env):
            call(str(home), "create", session="s1")
            with Client(str(home), timeout=60) as client:
                stream = client.stream("s1", "what is 6 * 7?", key="t1")
                partials = list(stream)
    finally:
        model.stop()
    assert stream.reply is not None
    assert len(partials) > 1  # token by token, not one frame
    assert "42" in "".join(partials)
