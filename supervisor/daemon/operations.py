"""The control operations a client may ask of the daemon, each checked before it acts."""

from __future__ import annotations

from typing import Protocol

from supervisor.daemon.endpoints import Client, Waiter
from supervisor.daemon.hosted import HostedSession
from supervisor.states import State
from worker.store.errors import InvalidSessionId
from worker.store.session_id import validate_session_id
from worker.wire import (
    Message,
    WireError,
    error,
    field,
    ok,
    optional_field,
    request_id_problem,
)


class Daemon(Protocol):
    """What the operations need of the daemon (passed in, so neither imports the other)."""

    @property
    def sessions(self) -> dict[str, HostedSession]: ...
    def create_session(self, waiter: Waiter, session_id: str, slot: int) -> None: ...
    def forget_pending_start(self, hosted: HostedSession) -> None: ...
    def statuses(self) -> list[Message]: ...
    def daemon_status(self) -> Message: ...
    def adopt_session(self, waiter: Waiter, session_id: str) -> None: ...
    def forget_session(self, waiter: Waiter, session_id: str) -> None: ...
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
        if op == "ping":
            client.reply(ok(request_id, daemon.daemon_status()))
        elif op == "status":
            wanted = optional_field(message, "session", str)
            statuses = daemon.statuses()
            if wanted is not None:
                statuses = [s for s in statuses if s["session"] == wanted]
                if not statuses:
                    client.reply(error(request_id, "not_found", f"no session {wanted!r}"))
                    return
            client.reply(ok(request_id, statuses))
        elif op == "create":
            session_id = _session_id(message)
            slot = optional_field(message, "slot", int) or 0
            if slot < 0:
                raise WireError("field 'slot' must be >= 0")
            daemon.create_session(waiter, session_id, slot)
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
        elif op == "adopt":  # cluster: a session moved here; claim it and serve it
            daemon.adopt_session(waiter, _session_id(message))
        elif op == "forget":  # cluster: a stopped session moved away; stop listing it
            daemon.forget_session(waiter, _session_id(message))
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


def _session_id(message: Message) -> str:
    return validate_session_id(field(message, "session", str))


def _hosted(daemon: Daemon, message: Message) -> HostedSession:
    session_id = _session_id(message)
    hosted = daemon.sessions.get(session_id)
    if hosted is None:
        raise LookupError(f"no session {session_id!r} is hosted here")
    return hosted
