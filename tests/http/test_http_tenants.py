"""Tenants on the HTTP port: bearer tokens of loopd.toml's ``[tenants]``, against a real serve.

Two tenants (``acme``, ``globex``) and the operator each hold a token; each refusal of
docs/operations.md ("Tenants") is tried by a hostile client: another tenant's token on a
session it did not create, a forged token, no token, a guessed session id.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.client import call
from supervisor.errors import ControlError
from supervisor.http.tokens import hash_token
from tests.harness.etcd_server import free_port
from tests.harness.support import REPO, running_daemon

pytestmark = pytest.mark.timeout(120)

TOKENS = {"acme": "acme-secret-1", "globex": "globex-secret-2", "loopd-operator": "op-3"}
FORGED = "acme-secret-2"


def _config(home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    lines = ["[tenants]", *(f'"{name}" = "{hash_token(t)}"' for name, t in TOKENS.items())]
    (home / "loopd.toml").write_text("\n".join(lines) + "\n")


class Port:
    """One keep-alive connection to the HTTP port, answering (status, headers, raw body)."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def ask(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        token: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        sent = {"Content-Type": "application/json", **(headers or {})}
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        data = None if body is None else json.dumps(body).encode()
        self.conn.request(method, path, body=data, headers=sent)
        answer = self.conn.getresponse()
        raw = answer.read()
        return answer.status, dict(answer.headers), raw

    def document(
        self, method: str, path: str, body: object = None, *, token: str | None = None
    ) -> dict[str, Any]:
        status, _headers, raw = self.ask(method, path, body, token=token)
        assert status in (200, 201), (status, raw)
        document = json.loads(raw)
        assert isinstance(document, dict)
        return document


@pytest.fixture
def port(tmp_path: Path) -> Iterator[tuple[Port, Path]]:
    home = tmp_path / "home"
    _config(home)
    number = free_port()
    with running_daemon(home, "--http", f"127.0.0.1:{number}"):
        api = Port(number)
        api.document("POST", "/v1/sessions", {"id": "a1"}, token=TOKENS["acme"])
        api.document("POST", "/v1/sessions", {"id": "g1"}, token=TOKENS["globex"])
        yield api, home
        api.conn.close()


# Every route that names a session: (method, path, body, extra headers).
SESSION_ROUTES = [
    pytest.param("GET", "/v1/sessions/{id}", None, {}, id="status"),
    pytest.param("POST", "/v1/sessions/{id}/requests", {"text": "hi"}, {}, id="send"),
    pytest.param(
        "POST",
        "/v1/sessions/{id}/requests",
        {"text": "hi"},
        {"Accept": "text/event-stream", "Idempotency-Key": "k-s"},
        id="send-streamed",
    ),
    pytest.param("GET", "/v1/sessions/{id}/records?since=0", None, {}, id="records"),
    pytest.param(
        "POST",
        "/v1/sessions/{id}/schedules",
        {"at": "2099-01-01T00:00:00Z", "text": "later", "key": "s1"},
        {},
        id="schedule",
    ),
    pytest.param("DELETE", "/v1/sessions/{id}/schedules/s1", None, {}, id="cancel"),
]


@pytest.mark.parametrize(("method", "path", "body", "headers"), SESSION_ROUTES)
def test_another_tenants_session_and_a_guessed_id_are_refused_403_with_the_same_bytes(
    port: tuple[Port, Path], method: str, path: str, body: object, headers: dict[str, str]
) -> None:
    api, _home = port
    theirs = api.ask(method, path.format(id="a1"), body, token=TOKENS["globex"], headers=headers)
    guessed = api.ask(method, path.format(id="zz9"), body, token=TOKENS["globex"], headers=headers)
    assert theirs[0] == guessed[0] == 403
    assert theirs[2] == guessed[2]  # byte for byte: nothing says the session exists
    assert json.loads(theirs[2])["error"]["code"] == "forbidden"
    # Nothing of globex's reached acme's session: its log holds no request.
    records = api.document("GET", "/v1/sessions/a1/records?since=0", token=TOKENS["acme"])
    assert [r for r in records["records"] if r.get("type") == "User"] == []


def test_a_send_on_the_connection_the_owner_opened_to_its_worker_is_still_refused_403(
    port: tuple[Port, Path],
) -> None:
    api, _home = port
    mine = api.document("POST", "/v1/sessions/a1/requests", {"text": "hi"}, token=TOKENS["acme"])
    # The port now keeps a connection to a1's worker open: acme's, never lent to globex.
    status, _headers, raw = api.ask(
        "POST", "/v1/sessions/a1/requests", {"text": "theirs"}, token=TOKENS["globex"]
    )
    assert (status, json.loads(raw)["error"]["code"]) == (403, "forbidden")
    records = api.document("GET", "/v1/sessions/a1/records?since=0", token=TOKENS["acme"])
    assert [r["key"] for r in records["records"] if r["type"] == "User"] == [mine["key"]]


def test_the_owner_reaches_its_session_and_the_operator_reaches_every_one(
    port: tuple[Port, Path],
) -> None:
    api, _home = port
    reply = api.document("POST", "/v1/sessions/a1/requests", {"text": "hi"}, token=TOKENS["acme"])
    assert reply["text"] == "echo: hi"
    records = api.document("GET", "/v1/sessions/a1/records?since=0", token=TOKENS["acme"])
    assert [r["key"] for r in records["records"] if r["type"] == "User"] == [reply["key"]]
    scheduled = api.document(
        "POST",
        "/v1/sessions/a1/schedules",
        {"at": "2099-01-01T00:00:00Z", "text": "later", "key": "s1"},
        token=TOKENS["acme"],
    )
    assert scheduled["key"] == "s1"
    cancelled = api.document("DELETE", "/v1/sessions/a1/schedules/s1", token=TOKENS["acme"])
    assert cancelled["cancelled"] is True
    for session in ("a1", "g1"):
        row = api.document("GET", f"/v1/sessions/{session}", token=TOKENS["loopd-operator"])
        assert row["session"] == session
        sent = api.document(
            "POST",
            f"/v1/sessions/{session}/requests",
            {"text": "op"},
            token=TOKENS["loopd-operator"],
        )
        assert sent["text"] == "echo: op"


def test_a_tenant_lists_only_its_own_sessions_and_the_operator_lists_all(
    port: tuple[Port, Path],
) -> None:
    api, home = port
    api.document("POST", "/v1/sessions", {"id": "a2"}, token=TOKENS["acme"])

    def listed(token: str) -> list[str]:
        document = api.document("GET", "/v1/sessions", token=token)
        return [row["session"] for row in document["sessions"]]

    assert listed(TOKENS["acme"]) == ["a1", "a2"]
    assert listed(TOKENS["globex"]) == ["g1"]
    assert listed(TOKENS["loopd-operator"]) == ["a1", "a2", "g1"]
    # The control socket's status op, asked as a tenant, lists the same.
    rows = call(str(home), "status", tenant="globex")
    assert isinstance(rows, list)
    assert [row["session"] for row in rows] == ["g1"]
    paged = call(str(home), "status", tenant="acme", limit=1)
    assert isinstance(paged, dict)
    assert [r["session"] for r in paged["sessions"]] == ["a1"]


@pytest.mark.parametrize(
    "authorization",
    [
        pytest.param(None, id="no-token"),
        pytest.param(f"Bearer {FORGED}", id="forged-token"),
        pytest.param("Bearer ", id="empty-token"),
        pytest.param(f"Basic {TOKENS['acme']}", id="another-scheme"),
        pytest.param(f"Bearer {TOKENS['acme']} extra", id="trailing-words"),
        pytest.param("Bearer " + "x" * 5000, id="huge-token"),
        pytest.param(hash_token(TOKENS["acme"]), id="the-digest-itself"),
    ],
)
def test_a_request_without_a_valid_token_is_401_with_one_json_error(
    port: tuple[Port, Path], authorization: str | None
) -> None:
    api, _home = port
    headers = {} if authorization is None else {"Authorization": authorization}
    for method, path, body in (
        ("GET", "/v1/sessions/a1", None),
        ("GET", "/v1/sessions", None),
        ("POST", "/v1/sessions", {"id": "x1"}),
    ):
        status, answer_headers, raw = api.ask(method, path, body, headers=headers)
        assert status == 401
        assert answer_headers["WWW-Authenticate"] == 'Bearer realm="loopd"'
        document = json.loads(raw)
        assert list(document) == ["error"]
        assert document["error"]["code"] == "unauthorized"
        assert TOKENS["acme"] not in raw.decode()
    # Nothing was created by the refused create.
    listed = api.document("GET", "/v1/sessions", token=TOKENS["loopd-operator"])
    assert "x1" not in [r["session"] for r in listed["sessions"]]


def test_a_tenant_cannot_take_another_tenants_session_by_asking_for_its_tenant_name(
    port: tuple[Port, Path],
) -> None:
    """The tenant comes from the token only: a body or a header naming another is ignored."""
    api, _home = port
    status, _headers, raw = api.ask(
        "GET", "/v1/sessions/a1", token=TOKENS["globex"], headers={"X-Tenant": "acme"}
    )
    assert status == 403, raw
    status, _headers, raw = api.ask(
        "POST", "/v1/sessions", {"id": "a1", "tenant": "acme"}, token=TOKENS["globex"]
    )
    assert status == 409, raw  # the id is taken: that much a create always says


def test_tenants_survive_a_restart_of_serve(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _config(home)
    number = free_port()
    with running_daemon(home, "--http", f"127.0.0.1:{number}"):
        api = Port(number)
        api.document("POST", "/v1/sessions", {"id": "a1"}, token=TOKENS["acme"])
        api.conn.close()
    assert (home / "tenants" / "a1").read_text() == "acme\n"
    with running_daemon(home, "--http", f"127.0.0.1:{number}"):
        api = Port(number)
        status, _headers, _raw = api.ask("GET", "/v1/sessions/a1", token=TOKENS["globex"])
        assert status == 403
        row = api.document("GET", "/v1/sessions/a1", token=TOKENS["acme"])
        assert row["session"] == "a1"
        api.conn.close()


def test_without_tenants_the_port_asks_for_no_token_and_a_local_caller_sees_all(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    number = free_port()
    with running_daemon(home, "--http", f"127.0.0.1:{number}"):
        api = Port(number)
        api.document("POST", "/v1/sessions", {"id": "s1"})
        api.document("GET", "/v1/sessions/s1", token="anything")  # noqa: S106 (ignored)
        call(str(home), "create", session="t1", tenant="acme")  # a local caller narrows
        listed = api.document("GET", "/v1/sessions")
        assert [r["session"] for r in listed["sessions"]] == ["s1", "t1"]
        with pytest.raises(ControlError, match="forbidden: tenant 'acme' may not reach"):
            call(str(home), "status", session="s1", tenant="acme")
        with pytest.raises(ControlError, match="forbidden: op 'metrics' is the operator's"):
            call(str(home), "metrics", tenant="acme")
        api.conn.close()


@pytest.mark.parametrize(
    ("table", "words"),
    [
        pytest.param('acme = "abc"', "[tenants] 'acme': the SHA-256 of a token", id="short"),
        pytest.param("acme = 7", "[tenants] 'acme': the SHA-256 of a token", id="not-a-string"),
        pytest.param(
            '"a\\u0001" = "' + "0" * 64 + '"', "without control characters", id="control-character"
        ),
        pytest.param(f'a = "{"0" * 64}"\nb = "{"0" * 64}"', "the same digest as 'a'", id="twice"),
        pytest.param("acme = []", "[tenants] 'acme': no digest", id="empty-list"),
    ],
)
def test_a_bad_tenants_table_stops_serve_with_one_line_naming_it(
    tmp_path: Path, table: str, words: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "loopd.toml").write_text(f"[tenants]\n{table}\n")
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "serve", "--home", str(home), "--print-config"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert words in lines[0]
    assert "loopd.toml" in lines[0]


def test_a_refused_create_leaves_the_id_to_nobody(port: tuple[Port, Path]) -> None:
    """A create refused after its tenant was recorded (an unknown App) gives the id back:
    no file names the tenant, so a session later restored or forked into that id is the
    operator's, not the squatter's."""
    api, home = port
    for n in range(3):
        status, _headers, _raw = api.ask("POST", "/v1/sessions", {"id": f"sq{n}", "app": "nope"},
                                         token=TOKENS["globex"])  # fmt: skip
        assert status == 400
    assert not any((home / "tenants").glob("sq*"))
    document = api.document("POST", "/v1/sessions", {"id": "sq0"}, token=TOKENS["acme"])
    assert document["session"] == "sq0"
    assert (home / "tenants" / "sq0").read_text() == "acme\n"


def test_a_tenants_create_of_a_taken_id_is_409_without_the_homes_path(
    port: tuple[Port, Path],
) -> None:
    api, home = port
    status, _headers, raw = api.ask("POST", "/v1/sessions", {"id": "a1"}, token=TOKENS["globex"])
    assert status == 409
    assert json.loads(raw)["error"]["code"] == "exists"
    assert str(home).encode() not in raw
    assert b"/sessions/" not in raw
    status, _headers, raw = api.ask("POST", "/v1/sessions", {"id": "a1"},
                                    token=TOKENS["loopd-operator"])  # fmt: skip
    assert status == 409
    assert str(home).encode() in raw  # the operator is told where
