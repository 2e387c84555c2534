"""What the worker answers: a session's state, and the reply to a refused request."""

from __future__ import annotations

import os

from worker.ipc.peer import Peer
from worker.ipc.wire import Message, error, ok
from worker.loop.schedule_book import book_of
from worker.loop.turns import PoisonRequest
from worker.store.errors import KeyExpired, LogSealed, NotOwnerNow, SessionError
from worker.store.format.records import SessionStart
from worker.store.session import Session
from worker.store.stats import STATS


def describe(session: Session) -> Message:
    """The session's state as its worker reports it (ready, state reports, replies), with
    the App and version its epoch's SessionStart names: the status of a session in a
    database, whose logs the supervisor does not read, takes them from here."""
    start = session.records[0]
    assert isinstance(start, SessionStart)  # an epoch's first record, always
    return {
        "pid": os.getpid(),
        "session": session.id,
        "epoch": session.epoch,
        "records": len(session.records),
        "slot": session.slot,
        "schedules": book_of(session).summary(),  # [pending, next due or None]
        "app": start.app,
        "app_version": start.app_version,
    }


def durable_point(request_id: object, session: Session) -> Message:
    """Between batches every group written is fsynced, so the log's length is a group
    boundary and all of it durable (``loopd backup``)."""
    try:
        size = os.stat(session.log_path).st_size
    except OSError as exc:
        return error(request_id, "unreadable", f"{session.log_path}: {exc}")
    return ok(request_id, {"epoch": session.epoch, "bytes": size})


def error_code(exc: SessionError) -> str:
    """The wire's error code for a store error: its class name, but ``key_expired``, and
    ``not_owner`` when this worker may not write (cluster: lease unproven, log sealed)."""
    if isinstance(exc, KeyExpired):
        return "key_expired"
    if isinstance(exc, PoisonRequest):
        return "poison_request"
    if isinstance(exc, NotOwnerNow | LogSealed):
        return "not_owner"
    return type(exc).__name__


def error_reply(request_id: object, exc: SessionError) -> Message:
    """The reply to a request refused before a byte of it was written: a ``not_owner`` says
    so (``before_write``); one sent after the fsync (``_apply_chunk``) leaves it unknown."""
    code = error_code(exc)
    STATS.errors[code] = STATS.errors.get(code, 0) + 1
    more = {"before_write": True} if code == "not_owner" else {}
    return error(request_id, code, str(exc), **more)


def streams(peer: Peer, control: Peer, payload: Message) -> bool:
    """Partials go to a client that asked for them on its own connection, never through
    the supervisor's relay (it expects one reply frame per request)."""
    return peer is not control and payload.get("stream") is True
