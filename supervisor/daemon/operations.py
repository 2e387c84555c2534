"""The control operations a client may ask of the daemon, each checked before it acts."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Protocol

from supervisor.daemon.app_versions import answer_app_versions
from supervisor.hosting.runtime import Hosting
from supervisor.moves.session_files import carried_tenant
from supervisor.sessions.endpoints import Client, Waiter
from supervisor.sessions.hosted import HostedSession
from supervisor.sessions.tenants import (
    OPERATOR,
    TenantBook,
    TenantError,
    TenantReplies,
    caller_tenant,
    refusal,
    tenant_problem,
)
from supervisor.states import State
from worker.ipc.wire import (
    MAX_FRAME,
    Message,
    WireError,
    encode,
    error,
    field,
    ok,
    optional_field,
    request_id_problem,
)
from worker.store.disk.layout import session_dir
from worker.store.errors import InvalidSessionId
from worker.store.session_id import validate_session_id

if TYPE_CHECKING:
    from supervisor.daemon.cluster_node import DaemonNode  # imported with --cluster only

MAX_STATUS_PAGE: Final = 1000
"""Rows a status page may be asked for."""
STATUS_PAGE_BYTES: Final = MAX_FRAME // 2
"""Encoded rows in one page: with a bounded ``last_error`` a row is at most a few KiB, so
a page always fits the frame with room for the reply around it."""

MAX_APP_NAME: Final = 64
MOVE_STEPS: Final = frozenset({"seal", "pull", "release", "discard", "receive", "install"})
"""A cluster node's own part of a move or takeover between hosts (docs/scaling.md 6, 7)."""


class Daemon(Protocol):
    """What the operations need of the daemon (passed in, so neither imports the other)."""

    cluster: DaemonNode | None
    loop: asyncio.AbstractEventLoop
    hosting: Hosting
    tenants: TenantBook
    home: str

    @property
    def sessions(self) -> dict[str, HostedSession]: ...
    def create_session(
        self, waiter: Waiter, session_id: str, slot: int, app: str | None = None
    ) -> None: ...
    def forget_pending_start(self, hosted: HostedSession) -> None: ...
    def statuses(self) -> list[Message]: ...
    def daemon_status(self) -> Message: ...
    def adopt_session(self, waiter: Waiter, session_id: str, app: str | None = None) -> None: ...
    def forget_session(self, waiter: Waiter, session_id: str) -> None: ...
    def move_step(self, waiter: Waiter, op: str, session_id: str, fields: Message) -> None: ...
    def remember_intent(self, session_id: str, *, stopped: bool) -> str | None: ...
    def follow_events(self, client: Client) -> bool: ...
    def metrics_text(self) -> str: ...


def dispatch(daemon: Daemon, client: Client, message: Message) -> None:
    """Answer one control request; a malformed one gets an error reply, never a crash."""
    request_id = message.get("id")
    problem = request_id_problem(request_id)
    if problem is not None:
        client.reply(error(None, "bad_request", problem))
        return
    waiter = Waiter(client, request_id)
    try:
        op = field(message, "op", str)
        # Tenants (docs/operations.md): the one place a caller's tenant meets the op.
        tenant = caller_tenant(message)
        if tenant is not None and (why := refusal(daemon.tenants, tenant, op, message)):
            client.reply(error(request_id, "forbidden", why))
            return
        if tenant is not None:  # its errors say no more than its own sessions hold
            client = TenantReplies(client, daemon.home)
            waiter = Waiter(client, request_id)
        if op == "ping":
            client.reply(ok(request_id, daemon.daemon_status()))
        elif op == "status":
            wanted = optional_field(message, "session", str)
            limit = optional_field(message, "limit", int)
            if wanted is not None:
                found = daemon.sessions.get(wanted)
                if found is None:
                    client.reply(error(request_id, "not_found", f"no session {wanted!r}"))
                    return
                client.reply(ok(request_id, [found.status()]))
            elif limit is not None:
                after = optional_field(message, "after", str) or ""
                client.reply(ok(request_id, status_page(daemon, after, limit, tenant)))
            elif tenant is not None:
                rows = status_page(daemon, "", len(daemon.sessions) + 1, tenant, paged=False)
                client.reply(ok(request_id, rows["sessions"]))
            else:
                client.reply(ok(request_id, daemon.statuses()))
        elif op == "app_versions":  # each session's App version against the one it would load
            answer_app_versions(daemon.loop, daemon.sessions, daemon.hosting.intent.app_of, waiter)
        elif op == "create":
            session_id = _session_id(message)
            slot = optional_field(message, "slot", int) or 0
            if slot < 0:
                raise WireError("field 'slot' must be >= 0")
            if optional_field(message, "replicas", int) not in (None, 1):  # an older client's
                raise WireError("field 'replicas' is retired: loopd no longer copies logs "
                                "between hosts (docs/scaling.md)")  # fmt: skip
            app = _app(message)
            given = _give(daemon, session_id, tenant, waiter)
            if given is not None:
                daemon.create_session(given, session_id, slot, app)
        elif op == "connect":
            _hosted(daemon, message).submit(waiter, {"op": "connect"})
        elif op in ("send", "compact"):
            hosted = _hosted(daemon, message)
            if op == "send":
                request: Message = {"text": field(message, "text", str)}
                key = optional_field(message, "key", str)
                if key is not None:
                    request["key"] = key
                if optional_field(message, "untrusted", bool):
                    request["untrusted"] = True
                hosted.submit(waiter, {"op": "request", "request": request})
            else:
                forwarded: Message = {"op": "compact"}
                summary = optional_field(message, "summary", str)
                if summary is not None:
                    forwarded["summary"] = summary
                hosted.submit(waiter, forwarded)
        elif op == "backup_point":  # the newest log's durable length at a group boundary
            _hosted(daemon, message).submit(waiter, {"op": "durable_point"})
        elif op == "metrics":
            client.reply(ok(request_id, daemon.metrics_text()))
        elif op == "events":
            if daemon.follow_events(client):
                client.reply(ok(request_id, "following"))
            else:
                client.reply(error(request_id, "bad_request", "this connection cannot follow"))
        elif op in ("start", "stop", "restart") and (
            problem := daemon.remember_intent(_hosted(daemon, message).id, stopped=op == "stop")
        ):
            client.reply(error(request_id, "intent", problem))
        elif op == "start":
            hosted = _hosted(daemon, message)
            daemon.forget_pending_start(hosted)
            if hosted.state in (State.RUNNING, State.STARTING):
                client.reply(ok(request_id, hosted.status()))
            elif hosted.state is State.STOPPING:
                hosted.restart_after_stop = True
                hosted.ready_waiters.append(waiter)
            else:
                hosted.ready_waiters.append(waiter)
                if hosted.state is State.BACKOFF:
                    hosted.start()
                else:
                    hosted.operator_start()
        elif op == "stop":
            hosted = _hosted(daemon, message)
            daemon.forget_pending_start(hosted)
            hosted.stop_waiters.append(waiter)
            hosted.stop()
        elif op == "adopt":  # a session moved here (cluster: claimed, served) or restored
            session_id = _session_id(message)
            named = optional_field(message, "owner", str)  # a restore's: its tenant or none
            try:
                if named is not None:
                    daemon.tenants.assign(session_id, _owner(named))
                elif session_id not in daemon.sessions:  # forked or moved in: the tenant
                    # a move carried in its sealed files, else the operator's (never a
                    # stale file's)
                    daemon.tenants.assign(session_id, carried_tenant(daemon.home, session_id))
            except TenantError as exc:
                client.reply(error(request_id, "unavailable", f"{exc}; nothing was done"))
                return
            daemon.adopt_session(waiter, session_id, _app(message))
        elif op in MOVE_STEPS:  # cluster: a move or takeover between hosts
            daemon.move_step(waiter, op, _session_id(message), message)
        elif op == "forget":  # cluster: a stopped session moved away; stop listing it
            session_id = _session_id(message)
            gone = _Answered(waiter.client, _give_back(daemon.tenants, session_id))
            daemon.forget_session(Waiter(gone, request_id), session_id)
        elif op == "restart":
            hosted = _hosted(daemon, message)
            daemon.forget_pending_start(hosted)
            hosted.ready_waiters.append(waiter)
            hosted.stop(restart=True)
        else:
            client.reply(error(request_id, "bad_request", f"unknown op {op!r}"))
    except WireError as exc:
        client.reply(error(request_id, "bad_request", exc.why))
    except InvalidSessionId as exc:
        client.reply(error(request_id, "bad_request", str(exc)))
    except LookupError as exc:
        client.reply(error(request_id, "not_found", str(exc.args[0])))


def status_page(
    daemon: Daemon, after: str, limit: int, tenant: str | None = None, *, paged: bool = True
) -> Message:
    """The status rows of the sessions after ``after`` in id order: at most ``limit`` and
    at most ``STATUS_PAGE_BYTES`` of them, so any number of sessions can be listed page by
    page (``next``: the ``after`` of the next page; None after the last). A ``tenant``
    sees its own sessions only; unpaged, every one of them.

    Only the page's rows are made (each reads its worker's RSS), not every session's.
    """
    if paged and not 1 <= limit <= MAX_STATUS_PAGE:
        raise WireError(f"field 'limit' must be from 1 to {MAX_STATUS_PAGE}")
    ids = daemon.sessions if tenant is None else daemon.tenants.owned_by(tenant)
    later = sorted(s for s in ids if s > after and s in daemon.sessions)
    rows: list[Message] = []
    size = 0
    for session_id in later[:limit]:
        row = daemon.sessions[session_id].status()
        size += len(encode(row))
        if paged and rows and size > STATUS_PAGE_BYTES:
            break
        rows.append(row)
    more = len(later) > len(rows)
    return {"sessions": rows, "next": rows[-1]["session"] if more and rows else None}


def _give(daemon: Daemon, session_id: str, tenant: str | None, waiter: Waiter) -> Waiter | None:
    """Before a create: the new session is the caller's tenant's (or the operator's),
    durably, unless the id is taken (then ``create`` answers ``exists`` and nothing of
    the session's owner changes). The waiter to answer the create through: a create that
    fails gives the id back (its file removed), so a refused create squats nothing. None
    (answered) if it cannot be recorded, or another create of the id is in flight."""
    book = daemon.tenants
    taken = session_id in daemon.sessions or os.path.lexists(session_dir(daemon.home, session_id))
    if taken:
        return waiter
    if session_id in book.pending:  # a cluster's create waits for etcd off the loop
        waiter.client.reply(error(waiter.request_id, "busy", "a create of this id is in flight"))
        return None
    try:
        book.assign(session_id, tenant)
    except TenantError as exc:
        waiter.client.reply(error(waiter.request_id, "unavailable", f"{exc}; nothing was done"))
        return None
    book.pending.add(session_id)

    def answered(ok: bool) -> None:
        book.pending.discard(session_id)
        if not ok:
            with contextlib.suppress(TenantError):  # not removed: the operator's at worst
                book.assign(session_id, None)

    return Waiter(_Answered(waiter.client, answered), waiter.request_id)


def _give_back(book: TenantBook, session_id: str) -> Callable[[bool], None]:
    """Once a forget succeeded (the session left this node), its tenant file goes too."""

    def forgotten(ok: bool) -> None:
        if ok:
            with contextlib.suppress(TenantError):  # kept: its next create gives it anew
                book.assign(session_id, None)

    return forgotten


class _Answered:
    """A client whose first reply is also told to ``then`` (True if it was a success)."""

    def __init__(self, client: Client, then: Callable[[bool], object]) -> None:
        self.client, self.then, self.told = client, then, False

    def _tell(self, message: Message) -> None:
        if not self.told:
            self.told = True
            self.then(message.get("ok") is True)

    def reply(self, message: Message) -> None:
        self._tell(message)
        self.client.reply(message)

    def reply_relayed(self, message: Message) -> None:
        self._tell(message)
        self.client.reply_relayed(message)

    def reply_with_fd(self, message: Message, fd: int) -> bool:
        self._tell(message)
        return self.client.reply_with_fd(message, fd)


def _app(message: Message) -> str | None:
    app = optional_field(message, "app", str)
    if app is not None and len(app) > MAX_APP_NAME:
        raise WireError(f"field 'app' must be at most {MAX_APP_NAME} characters")
    return app


def _owner(owner: str) -> str | None:
    """The tenant an ``adopt``'s ``owner`` gives the session; None: the operator."""
    problem = tenant_problem(owner)
    if problem is not None:
        raise WireError(f"field 'owner': {problem}")
    return None if owner == OPERATOR else owner


def _session_id(message: Message) -> str:
    return validate_session_id(field(message, "session", str))


def _hosted(daemon: Daemon, message: Message) -> HostedSession:
    session_id = _session_id(message)
    hosted = daemon.sessions.get(session_id)
    if hosted is None:
        raise LookupError(f"no session {session_id!r} is hosted here")
    return hosted
