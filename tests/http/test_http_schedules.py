"""The schedule routes of ``loopd serve --http`` against a real server and real workers.

Schedules here are due a second or two ahead; the tests poll the session's records and
status over HTTP against deadlines, never sleep for the delivery.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.etcd_server import free_port
from tests.harness.http_client import JSON, Api
from tests.harness.support import poll_until, running_daemon
from worker.store.schedules import parse_time

DEADLINE = 30.0
"""Seconds a poll waits for a delivery: far past its due time, well within the timeout."""
MARGIN = 1.0
"""Seconds past a cancelled schedule's due time before its absence is judged."""


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Api]:
    port = free_port()
    with running_daemon(tmp_path / "home", "--http", f"127.0.0.1:{port}"):
        api = Api(port)
        status, _ = api.ask("POST", "/v1/sessions", {"id": "s"})
        assert status == 201
        yield api
        api.conn.close()


def _ahead(seconds: float) -> str:
    return (datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)).isoformat()


def _schedule(api: Api, key: str, at: str) -> str:
    """Schedule ``key`` at ``at`` over HTTP; the time as the worker wrote it."""
    body = {"at": at, "text": f"scheduled {key}", "key": key}
    status, answer = api.ask("POST", "/v1/sessions/s/schedules", body)
    assert (status, answer["key"], answer["duplicate"]) == (200, key, False), answer
    return str(answer["at"])


def _users(api: Api) -> list[dict[str, Any]]:
    status, page = api.ask("GET", "/v1/sessions/s/records")
    assert status == 200, page
    return [r for r in page["records"] if r["type"] == "User"]


def _scheduled(api: Api) -> int:
    status, row = api.ask("GET", "/v1/sessions/s")
    assert status == 200, row
    return int(row["scheduled"])


@pytest.mark.timeout(60)
def test_a_schedule_made_over_http_is_delivered_once_with_its_key_not_early(
    served: Api,
) -> None:
    at = _schedule(served, "h1", _ahead(1.5))

    def delivered() -> list[dict[str, Any]]:
        return [u for u in _users(served) if u["key"] == "h1"]

    users = poll_until(delivered, timeout=DEADLINE, what="the schedule h1 to be delivered")
    assert len(users) == 1, users
    assert users[0]["text"] == "scheduled h1"
    assert (parse_time(users[0]["time"]) or 0.0) >= (parse_time(at) or 0.0), (users[0], at)
    poll_until(lambda: _scheduled(served) == 0, timeout=DEADLINE, what="nothing scheduled")
    assert [u["key"] for u in _users(served)] == ["h1"]  # still once


@pytest.mark.timeout(60)
def test_a_schedule_cancelled_over_http_is_never_delivered(served: Api) -> None:
    when = _ahead(1.5)
    at = _schedule(served, "cancelled", when)
    _schedule(served, "kept", when)  # due with it: its delivery shows the due time came
    status, answer = served.ask("DELETE", "/v1/sessions/s/schedules/cancelled")
    assert (status, answer["cancelled"], answer["key"]) == (200, True, "cancelled"), answer
    assert answer["state"]["schedules"][0] == 1  # the worker's count, "kept" alone
    due = parse_time(at) or 0.0

    def all_done() -> bool:
        past_due = datetime.datetime.now(datetime.UTC).timestamp() > due + MARGIN
        return past_due and _scheduled(served) == 0

    poll_until(all_done, timeout=DEADLINE, what="the due time to pass with nothing scheduled")
    assert [u["key"] for u in _users(served)] == ["kept"]
    status, again = served.ask("DELETE", "/v1/sessions/s/schedules/cancelled")
    assert (status, again["cancelled"], again["why"]) == (200, False, "not pending"), again
    status, late = served.ask("DELETE", "/v1/sessions/s/schedules/kept")
    assert (status, late["cancelled"], late["why"]) == (200, False, "already delivered"), late


BAD_INPUT = {
    "missing-at": ("POST", "/v1/sessions/s/schedules", {"text": "x"}, 400, "bad_request", "'at'"),
    "at-without-a-zone": (
        "POST", "/v1/sessions/s/schedules", {"at": "2099-01-01T00:00:00", "text": "x"},
        400, "bad_request", "no time zone",
    ),
    "body-not-json": (
        "POST", "/v1/sessions/s/schedules", b'{"at": ', 400, "bad_request", "not JSON",
    ),
    "schedule-for-an-unknown-session": (
        "POST", "/v1/sessions/nope/schedules", {"at": "2099-01-01T00:00:00Z", "text": "x"},
        404, "not_found", "nope",
    ),
    "cancel-for-an-unknown-session": (
        "DELETE", "/v1/sessions/nope/schedules/k", None, 404, "not_found", "nope",
    ),
    "cancel-with-a-key-too-long": (
        "DELETE", "/v1/sessions/s/schedules/" + "k" * 257, None, 400, "bad_request", "key",
    ),
    "get-on-a-schedule": ("GET", "/v1/sessions/s/schedules/k", None, 405, "bad_request", "GET"),
}  # fmt: skip


@pytest.mark.timeout(60)
def test_bad_schedule_input_gets_one_json_error_each_and_schedules_nothing(
    served: Api,
) -> None:
    for name, (method, path, body, expected, code, says) in BAD_INPUT.items():
        data = body if isinstance(body, bytes) or body is None else _json(body)
        # One connection for all: each error is one whole response, or the next fails.
        served.conn.request(method, path, body=data, headers=JSON)
        answer = served.conn.getresponse()
        document = _json_of(answer.read())
        assert answer.status == expected, (name, answer.status, document)
        assert answer.headers["Content-Type"] == "application/json", name
        assert list(document) == ["error"], (name, document)
        assert sorted(document["error"]) == ["code", "message"], (name, document)
        assert document["error"]["code"] == code, (name, document)
        assert says in document["error"]["message"], (name, document)
    assert _scheduled(served) == 0
    assert _users(served) == []


def _json(document: object) -> bytes:
    return json.dumps(document).encode()


def _json_of(data: bytes) -> dict[str, Any]:
    document = json.loads(data)
    assert isinstance(document, dict)
    return document
