"""A single node's ``adopt`` and ``forget``: host a restored session, drop a removed one.

``loopd restore`` puts a session's directory back while the daemon runs, and ``adopt``
makes the daemon list it (STOPPED: the operator starts it). ``loopd delete`` moves a
stopped session's directory to the trash, and ``loopd forget`` is for a directory an
operator moved aside: ``forget`` then stops listing it and clears its intent entry, so
that ``create`` of the same id starts afresh, without a restart of the daemon. (In a
cluster, the same two operations serve a move; supervisor/cluster/.)
"""

from __future__ import annotations

import os
from typing import Final, Protocol

from supervisor.daemon.worker_specs import UnknownApp
from supervisor.hosting.intent import IntentError, IntentFile
from supervisor.sessions.endpoints import Waiter
from supervisor.sessions.hosted import HostedSession
from supervisor.sessions.tenants import TenantBook, TenantError
from supervisor.states import State
from worker.ipc.wire import error, ok
from worker.store.disk.layout import session_dir

FORGETTABLE: Final = frozenset({State.STOPPED, State.FATAL, State.EXITED})
"""States with no worker and nothing that will start one (BACKOFF and IDLE would)."""


class Node(Protocol):
    """What these operations need of the daemon."""

    @property
    def home(self) -> str: ...
    @property
    def sessions(self) -> dict[str, HostedSession]: ...
    @property
    def intent(self) -> IntentFile: ...
    @property
    def tenants(self) -> TenantBook: ...
    def host_stopped(self, session_id: str) -> HostedSession: ...
    def forget_pending_start(self, hosted: HostedSession) -> None: ...


def adopt_local(node: Node, waiter: Waiter, session_id: str, app: str | None) -> None:
    """List a session whose directory is there (restored) and not hosted yet, STOPPED,
    under the named App ``app`` if given (what it was created with)."""
    hosted = node.sessions.get(session_id)
    directory = session_dir(node.home, session_id)
    if hosted is None:
        if not os.path.isdir(directory):
            waiter.client.reply(
                error(waiter.request_id, "not_found", f"{directory}: no such session")
            )
            return
        before = node.intent.app_of(session_id)
        try:
            if app is not None:
                node.intent.set_app(session_id, app)
            hosted = node.host_stopped(session_id)
        except IntentError as exc:
            waiter.client.reply(error(waiter.request_id, "intent", f"{exc}; nothing was done"))
            return
        except UnknownApp as exc:
            node.intent.set_app(session_id, before)
            waiter.client.reply(error(waiter.request_id, "unknown_app", str(exc)))
            return
    waiter.client.reply(ok(waiter.request_id, hosted.status()))


def forget_local(node: Node, waiter: Waiter, session_id: str) -> None:
    """Stop listing a session whose directory is gone, and clear its intent entry and
    its tenant."""
    hosted = node.sessions.get(session_id)
    directory = session_dir(node.home, session_id)
    if hosted is not None and (hosted.worker is not None or hosted.state not in FORGETTABLE):
        why = f"session {session_id} is {hosted.state.value}: stop it first (loopd stop)"
        waiter.client.reply(error(waiter.request_id, "busy", why))
        return
    if os.path.lexists(directory):
        why = (
            f"{directory}: the session's directory is still there; `loopd delete` moves it "
            "to the trash and forgets it"
        )
        waiter.client.reply(error(waiter.request_id, "exists", why))
        return
    try:
        node.intent.forget(session_id)
        node.tenants.assign(session_id, None)  # a create of the id starts the operator's
    except (IntentError, TenantError) as exc:
        waiter.client.reply(error(waiter.request_id, "intent", f"{exc}; nothing was done"))
        return
    if hosted is not None:
        node.forget_pending_start(hosted)
        del node.sessions[session_id]
    waiter.client.reply(ok(waiter.request_id, {"forgotten": hosted is not None}))
