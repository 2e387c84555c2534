"""A client of ``serve --http`` for the tests: one keep-alive connection, and event streams
read on connections of their own (shared by the HTTP API's test modules)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

JSON = {"Content-Type": "application/json"}
STREAM = {**JSON, "Accept": "text/event-stream"}


class Api:
    """One keep-alive connection to the HTTP port."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)

    def ask(
        self, method: str, path: str, body: object = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, Any]]:
        data = None if body is None else json.dumps(body).encode()
        self.conn.request(method, path, body=data, headers={**JSON, **(headers or {})})
        answer = self.conn.getresponse()
        document = json.loads(answer.read())
        assert isinstance(document, dict)
        return answer.status, document

    def events(
        self, path: str, body: object, headers: dict[str, str], *, stop_after: int | None = None
    ) -> list[tuple[str, str, dict[str, Any]]]:
        """(id, kind, data) of an event stream on a new connection, the first
        ``stop_after`` only (then it hangs up)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        try:
            data = json.dumps(body).encode()
            conn.request("POST", path, body=data, headers={**STREAM, **headers})
            answer = conn.getresponse()
            assert answer.status == 200
            assert answer.headers["Content-Type"] == "text/event-stream"
            return list(_read_events(answer, stop_after))
        finally:
            conn.close()


def _read_events(
    answer: http.client.HTTPResponse, stop_after: int | None
) -> Iterator[tuple[str, str, dict[str, Any]]]:
    fields: dict[str, str] = {}
    count = 0
    while line := answer.readline():
        text = line.decode().rstrip("\n")
        if text:
            name, _, value = text.partition(": ")
            fields[name] = value
            continue
        if "data" in fields:
            yield fields.get("id", ""), fields.get("event", ""), json.loads(fields["data"])
            count += 1
            if stop_after is not None and count >= stop_after:
                return
        fields = {}
