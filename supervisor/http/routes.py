"""The endpoints: each request to its answer (docs/http.md; openapi.json describes them)."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Callable
from importlib import resources
from typing import Final
from urllib.parse import parse_qs, unquote, urlsplit

from supervisor.client import Client
from supervisor.errors import ControlError
from supervisor.http.calls import ClientPool
from supervisor.http.parser import HttpError, HttpRequest
from supervisor.http.responses import (
    Writer,
    error_response,
    json_body,
    response,
    status_of,
)
from supervisor.http.sse import Turns
from supervisor.http.streaming import start_or_join, write_events, write_final_as_json
from supervisor.http.tokens import TokenTable
from supervisor.http.worker_links import WorkerLinks
from supervisor.sessions.tenants import OPERATOR
from worker.ipc.wire import Message

MAX_KEY: Final = 256
"""Characters of an Idempotency-Key: a request id's bound on the wire."""
_KEY: Final = re.compile(r"[\x21-\x7e]{1,256}")
ROUTES: Final = (
    ("GET", "/v1/sessions"),
    ("POST", "/v1/sessions"),
    ("GET", "/v1/sessions/{id}"),
    ("POST", "/v1/sessions/{id}/requests"),
    ("GET", "/v1/sessions/{id}/records"),
    ("POST", "/v1/sessions/{id}/schedules"),
    ("DELETE", "/v1/sessions/{id}/schedules/{key}"),
    ("GET", "/v1/openapi.json"),
)
"""Every (method, path) served; a test checks openapi.json lists exactly these."""


def openapi_document() -> bytes:
    """The OpenAPI document kept beside this module, as served."""
    return resources.files("supervisor.http").joinpath("openapi.json").read_bytes()


class Api:
    """Answers the requests of every connection; its clients are the pool's."""

    def __init__(self, pool: ClientPool, tokens: TokenTable | None = None) -> None:
        self.pool = pool
        self.tokens = tokens  # None: no [tenants], no token asked (as before tenants)
        self.turns = Turns()
        self.links = WorkerLinks(pool)  # a send's own path: no thread between it and the worker
        self._openapi = openapi_document()

    async def answer(self, request: HttpRequest, writer: Writer) -> bool:
        """Write the answer to ``request``; whether the connection may serve another."""
        keep = request.keep_alive
        try:
            return await self._route(request, writer, keep, self._tenant(request))
        except HttpError as exc:
            extra: tuple[tuple[str, str], ...] = ()
            if exc.status == 401:
                extra = (("WWW-Authenticate", 'Bearer realm="loopd"'),)
            elif isinstance(exc, MethodNotAllowed):
                extra = (("Allow", exc.allowed),)
            writer.write(
                error_response(exc.status, exc.code, exc.message, keep_alive=keep, extra=extra)
            )
        except ControlError as exc:
            status = status_of(exc.code)
            writer.write(error_response(status, exc.code, exc.message, keep_alive=keep))
        return keep

    def answer_nowait(
        self, request: HttpRequest, writer: Writer, answered: Callable[[bool], None]
    ) -> bool:
        """Take a send ``answer`` would make on a kept worker connection, without a task:
        its answer is written and ``answered(keep)`` called later, from the connection's
        callbacks. False (nothing done, nothing called) for any other request, and for
        one this would refuse: ``answer`` takes it, with every check of its own."""
        if request.method != "POST":
            return False
        try:
            tenant = self._tenant(request)
            segments = _segments(request.target)
            if len(segments) != 4 or segments[:2] != ["v1", "sessions"]:
                return False
            if segments[3] != "requests":
                return False
            text, untrusted, key, streamed = _send_fields(request)
        except HttpError:
            return False
        session = segments[2]
        if streamed or self.turns.get(session, key) is not None:
            return False  # an event stream, or a stream of this key runs: ``answer``'s
        keep = request.keep_alive

        def done(outcome: Message | ControlError) -> None:
            # Called by a worker connection's callbacks: an error raised here would end
            # that connection (every send in flight on it) and leave this one unanswered.
            kept = keep
            try:
                if isinstance(outcome, ControlError):
                    kept = keep and outcome.code != "internal"  # a 500 ends it, as the port's
                    answer = error_response(status_of(outcome.code), outcome.code,
                                            outcome.message, keep_alive=kept)  # fmt: skip
                else:
                    answer = response(200, json_body({**outcome, "key": key}), keep_alive=keep)
            except Exception as exc:  # noqa: BLE001 (a callback's boundary: answered 500)
                asyncio.get_running_loop().call_exception_handler(
                    {"message": "an HTTP send's answer failed", "exception": exc}
                )
                writer.write(error_response(500, "internal", "serve failed to answer this "
                                            "request", keep_alive=False))  # fmt: skip
                answered(False)
                return
            writer.write(answer)
            answered(kept)

        return self.links.send_nowait(
            session, text, key=key, untrusted=untrusted, tenant=tenant, done=done
        )

    def _tenant(self, request: HttpRequest) -> str | None:
        """The tenant the request's bearer token names (None: the operator, or no tokens
        configured); HttpError 401 when tokens are configured and it bears none of them."""
        if self.tokens is None:
            return None
        header = request.header("authorization")
        tenant = self.tokens.tenant_of(header)
        if tenant is None:
            why = "no bearer token" if header is None else "a bearer token of no tenant"
            raise HttpError(401, "unauthorized", f"{why}: send Authorization: Bearer TOKEN, "
                            "a token of loopd.toml's [tenants]")  # fmt: skip
        return None if tenant == OPERATOR else tenant

    async def _route(
        self, request: HttpRequest, writer: Writer, keep: bool, tenant: str | None
    ) -> bool:
        parts = urlsplit(request.target)
        segments = _segments(request.target)
        method = request.method
        if segments == ["v1", "openapi.json"]:
            _allow(method, "GET")
            writer.write(response(200, self._openapi, keep_alive=keep))
        elif segments == ["v1", "sessions"] and method == "GET":  # a tenant's: its own
            rows = await self.pool.run(lambda c: c.call("status"), tenant)
            writer.write(response(200, json_body({"sessions": rows}), keep_alive=keep))
        elif segments == ["v1", "sessions"]:
            _allow(method, "POST", also="GET")
            body = _json_object(request)
            session = _string(body, "id")
            fields: dict[str, object] = {"session": session}
            if "app" in body:
                fields["app"] = _string(body, "app")
            result = await self.pool.run(lambda c: c.call("create", **fields), tenant)
            writer.write(response(201, json_body(_row(result, session)), keep_alive=keep))
        elif len(segments) == 3 and segments[:2] == ["v1", "sessions"]:
            _allow(method, "GET")
            rows = await self.pool.run(lambda c: c.call("status", session=segments[2]), tenant)
            row = rows[0] if isinstance(rows, list) and rows else rows
            writer.write(response(200, json_body(row), keep_alive=keep))
        elif segments[:2] == ["v1", "sessions"] and segments[3:] == ["records"]:
            _allow(method, "GET")
            page = await self._records(segments[2], parse_qs(parts.query), tenant)
            writer.write(response(200, json_body(page), keep_alive=keep))
        elif segments[:2] == ["v1", "sessions"] and segments[3:] == ["schedules"]:
            _allow(method, "POST")
            result = await self._schedule(segments[2], request, tenant)
            writer.write(response(200, json_body(result), keep_alive=keep))
        elif (
            len(segments) == 5 and segments[:2] == ["v1", "sessions"] and segments[3] == "schedules"
        ):
            _allow(method, "DELETE")
            session, key = segments[2], segments[4]
            result = await self.pool.run(lambda c: c.cancel_schedule(session, key), tenant)
            writer.write(response(200, json_body(result), keep_alive=keep))
        elif (
            len(segments) == 4 and segments[:2] == ["v1", "sessions"] and segments[3] == "requests"
        ):
            _allow(method, "POST")
            return await self._send(segments[2], request, writer, keep, tenant)
        else:
            raise HttpError(404, "not_found", f"no endpoint {parts.path}")
        return keep

    async def _records(
        self, session: str, query: dict[str, list[str]], tenant: str | None
    ) -> object:
        since = _number(query, "since", 0)
        limit = _number(query, "limit", 1000)
        epoch = _number(query, "epoch", -1)

        def read(client: Client) -> object:
            return client.records(session, since=since, epoch=None if epoch < 0 else epoch)

        page = await self.pool.run(read, tenant)
        if isinstance(page, dict) and isinstance(page.get("records"), list):
            records = page["records"][: max(1, limit)]
            page = {**page, "records": records, "next": since + len(records)}
        return page

    async def _schedule(self, session: str, request: HttpRequest, tenant: str | None) -> object:
        """``{"at", "text"[, "key", "untrusted"]}``: ``Client.schedule``'s answer."""
        body = _json_object(request)
        at, text = _string(body, "at"), _string(body, "text")
        key = _string(body, "key") if "key" in body else None
        untrusted = body.get("untrusted", False)
        if not isinstance(untrusted, bool):
            raise HttpError(400, "bad_request", "field 'untrusted' must be true or false")
        return await self.pool.run(
            lambda c: c.schedule(session, at, text, key=key, untrusted=untrusted), tenant
        )

    async def _send(
        self,
        session: str,
        request: HttpRequest,
        writer: Writer,
        keep: bool,
        tenant: str | None,
    ) -> bool:
        text, untrusted, key, streamed = _send_fields(request)
        if tenant is not None and (streamed or self.turns.get(session, key) is not None):
            # A stream is started or joined here, not by the daemon: the daemon is asked
            # first whether the session is this tenant's (403 forbidden if not).
            await self.pool.run(lambda c: c.call("status", session=session), tenant)
        if streamed:
            last_id = _last_event_id(request.header("last-event-id"))
            turn = await start_or_join(self.pool, self.turns, session, text, key, untrusted,
                                       last_id, tenant)  # fmt: skip
            await write_events(turn, writer, last_id)
            return False  # an event stream ends with its connection
        joined = self.turns.get(session, key)
        if joined is not None:  # a stream of this key runs: its reply is this answer
            await write_final_as_json(joined, writer, keep)
            return keep
        result = await self.links.send(session, text, key=key, untrusted=untrusted, tenant=tenant)
        writer.write(response(200, json_body({**result, "key": key}), keep_alive=keep))
        return keep


def _segments(target: str) -> list[str]:
    """The target's path, split at its slashes, each part unquoted."""
    if _PLAIN_PATH.fullmatch(target):  # no query, fragment, escape or authority: itself
        return target.split("/")[1:]
    return [unquote(s) for s in urlsplit(target).path.split("/")[1:]]


_PLAIN_PATH: Final = re.compile(r"/(?!/)[^?#%]*")
"""A target ``urlsplit`` and ``unquote`` give back unchanged (``parser._TARGET`` has
already refused whitespace and control characters)."""


def _send_fields(request: HttpRequest) -> tuple[str, bool, str, bool]:
    """A send's text, untrusted flag, key (made up without ``Idempotency-Key``) and
    whether it asks for an event stream; HttpError if one of them is wrong."""
    body = _json_object(request)
    text = _string(body, "text")
    untrusted = body.get("untrusted", False)
    if not isinstance(untrusted, bool):
        raise HttpError(400, "bad_request", "field 'untrusted' must be true or false")
    key = request.header("idempotency-key")
    if key is None:
        key = f"auto-{uuid.uuid4().hex}"
    elif not _KEY.fullmatch(key):
        raise HttpError(400, "bad_request", f"an Idempotency-Key of 1 to {MAX_KEY} visible "
                        "ASCII characters")  # fmt: skip
    streamed = "text/event-stream" in (request.header("accept") or "")
    return text, untrusted, key, streamed


class MethodNotAllowed(HttpError):
    """A 405: the method is not served at this path; ``allowed`` is the Allow header."""

    def __init__(self, method: str, allowed: str) -> None:
        message = f"{method} is not served here (allowed: {allowed})"
        super().__init__(405, "bad_request", message)
        self.args = (method, allowed)  # as this class is made: it pickles
        self.method = method
        self.allowed = allowed


def _allow(method: str, allowed: str, *, also: str | None = None) -> None:
    """MethodNotAllowed unless ``method`` is ``allowed`` (``also`` is served at the same
    path by another branch: the Allow header names both)."""
    if method != allowed:
        raise MethodNotAllowed(method, allowed if also is None else f"{also}, {allowed}")


def _json_object(request: HttpRequest) -> dict[str, object]:
    kind = (request.header("content-type") or "application/json").split(";")[0].strip()
    if kind.lower() != "application/json":
        raise HttpError(415, "bad_request", "the body must be application/json")
    try:
        document = json.loads(request.body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise HttpError(400, "bad_request", f"the body is not JSON: {exc}") from exc
    except RecursionError as exc:
        raise HttpError(400, "bad_request", "the body's JSON nests too deeply") from exc
    if not isinstance(document, dict):
        raise HttpError(400, "bad_request", "the body must be a JSON object")
    return document


def _string(body: dict[str, object], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str):
        raise HttpError(400, "bad_request", f"field {name!r} must be a string")
    try:
        value.encode()  # a lone surrogate (JSON may escape one) goes on no wire of ours
    except UnicodeEncodeError as exc:
        raise HttpError(400, "bad_request", f"field {name!r} holds a lone surrogate, "
                        "which is no Unicode character") from exc  # fmt: skip
    return value


def _number(query: dict[str, list[str]], name: str, default: int) -> int:
    values = query.get(name)
    if values is None:
        return default
    if len(values) != 1 or not values[0].isascii() or not values[0].isdigit():
        raise HttpError(400, "bad_request", f"query {name!r} must be one number")
    if len(values[0]) > MAX_DIGITS:
        raise HttpError(400, "bad_request", f"query {name!r} must be one number of at most "
                        f"{MAX_DIGITS} digits")  # fmt: skip
    return int(values[0])


MAX_DIGITS: Final = 18
"""Digits of a number in a query or a Last-Event-ID: any count fits a signed 64-bit
integer, what the worker's wire carries (a longer one is refused, never cut)."""


def _last_event_id(value: str | None) -> int:
    if value is None or value == "":
        return 0
    if not value.isascii() or not value.isdigit() or len(value) > MAX_DIGITS:
        raise HttpError(400, "bad_request", "a Last-Event-ID that is not an event's id")
    return int(value)


def _row(result: object, session: str) -> object:
    return result if isinstance(result, dict) else {"session": session, "result": result}
