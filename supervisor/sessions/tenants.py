"""Who each session belongs to (``<home>/tenants/<id>``), and the one rule every control call meets.

A control message may carry ``"tenant"``: the caller's tenant, set by the TLS port from
its peer's certificate and by the HTTP port from its bearer token (a local caller, the
home's owner, may set it too, and only narrows what it sees). A tenant reaches only the
sessions whose file names it; ``loopd-operator`` (and a message without the field)
reaches all. A session without a file is the operator's. Refusals are ``forbidden``
and say the same whether the session exists or not (docs/operations.md, "Tenants").
"""

from __future__ import annotations

import errno
import os
from typing import Final

from supervisor.errors import ServeError, SupervisorError
from supervisor.hosting.regular_file import read_regular
from supervisor.moves.session_files import TENANTS_DIR
from supervisor.sessions.endpoints import Client
from worker.ipc.tls_roles import MAX_TENANT, TENANT_NAME, not_yours
from worker.ipc.wire import Message, WireError, optional_field
from worker.store.disk import durable
from worker.store.errors import InvalidSessionId, SessionIOError
from worker.store.session_id import validate_session_id

OPERATOR: Final = "loopd-operator"
"""The tenant that sees every session: the TLS role's name, and an HTTP token's."""
MAX_FILE_BYTES: Final = 4096
TENANT_OPS: Final = frozenset(
    {"ping", "status", "create", "connect", "send", "compact", "start", "stop", "restart",
     "backup_point"}
)  # fmt: skip
"""The ops a tenant may ask (of its own sessions); the others are the operator's:
``metrics``, ``events`` and ``app_versions`` tell of every session, and ``adopt``,
``forget`` and a move's steps act on a home's files."""
_GONE: Final = frozenset({errno.ENOENT})
EXISTS_TO_A_TENANT: Final = (
    "a session of this id exists already (ids are one namespace per home: prefix yours "
    "with your tenant's name)"
)
"""The words of every ``exists`` a tenant gets: never the home's path, nor a cluster's
node (the operator's ``exists`` still names them)."""


class TenantError(SupervisorError):
    """A session's tenant file cannot be written; ``<path>: <why>``."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(path, why)
        self.path = path
        self.why = why

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


def tenant_problem(name: object) -> str | None:
    """Why ``name`` cannot be a tenant's name, or None."""
    if not isinstance(name, str) or TENANT_NAME.fullmatch(name) is None:
        return (f"a tenant is 1 to {MAX_TENANT} characters without control characters, "
                f"not {name!r:.80}")  # fmt: skip
    return None


def caller_tenant(message: Message) -> str | None:
    """The tenant a control message is asked for; None for the operator (all sessions).
    WireError if the field is not a tenant's name."""
    tenant = optional_field(message, "tenant", str)
    if tenant is None:
        return None
    problem = tenant_problem(tenant)
    if problem is not None:
        raise WireError(f"field 'tenant': {problem}")
    return None if tenant == OPERATOR else tenant


def refusal(book: TenantBook, tenant: str, op: str, message: Message) -> str | None:
    """Why ``tenant`` may not ask ``message`` (op ``op``), or None. The words depend on the
    tenant (and a refused op's name) only: never on the session, nor on whether it exists."""
    if op not in TENANT_OPS:
        return f"op {op!r:.80} is the operator's, not tenant {tenant!r}'s"
    session = message.get("session")
    if op == "create" or (op in ("ping", "status") and session is None):
        return None  # a create is given to its tenant; a list shows only its sessions
    if not isinstance(session, str):
        return None  # a bad request, answered as such
    if book.owner(session) != tenant:
        return not_yours(tenant)  # not even the id: the same bytes for every session
    return None


class TenantReplies:
    """A tenant's client: its errors name no path of the home, and an ``exists`` says
    that much and no more (where the id is taken is the operator's to know)."""

    def __init__(self, client: Client, home: str) -> None:
        self.client = client
        self.home = home

    def _discreet(self, message: Message) -> Message:
        failure = message.get("error")
        if message.get("ok") is True or not isinstance(failure, dict):
            return message
        words = failure.get("message")
        if failure.get("code") == "exists":
            words = EXISTS_TO_A_TENANT
        elif isinstance(words, str):
            words = words.replace(self.home, "<home>")
        return {**message, "error": {**failure, "message": words}}

    def reply(self, message: Message) -> None:
        self.client.reply(self._discreet(message))

    def reply_relayed(self, message: Message) -> None:
        self.client.reply_relayed(self._discreet(message))

    def reply_with_fd(self, message: Message, fd: int) -> bool:
        return self.client.reply_with_fd(self._discreet(message), fd)


class TenantBook:
    """The tenants of a home's sessions, read once at start (ServeError if the folder
    cannot be listed) and written through durably."""

    def __init__(self, home: str) -> None:
        self.directory = os.path.join(home, TENANTS_DIR)
        self._owners: dict[str, str] = {}
        self.pending: set[str] = set()
        """Ids whose create is in flight (given to its tenant, not yet answered): a second
        create of one is refused, never given to another tenant meanwhile."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            names = []
        except OSError as exc:
            raise ServeError(f"{self.directory}: cannot list: {exc.strerror}") from exc
        for name in names:
            tenant = self._read(name)
            if tenant is not None:
                self._owners[name] = tenant

    def _read(self, name: str) -> str | None:
        """The tenant in file ``name``; None for a file that names no session or tenant (a
        temporary file, a stray one): its session, if any, is the operator's."""
        try:
            validate_session_id(name)
        except InvalidSessionId:
            return None
        try:
            raw = read_regular(os.path.join(self.directory, name), MAX_FILE_BYTES)
        except OSError:
            return None
        if raw is None:
            return None
        try:
            tenant = raw.decode("utf-8").removesuffix("\n")
        except UnicodeDecodeError:
            return None
        return tenant if tenant_problem(tenant) is None else None

    def owner(self, session_id: str) -> str | None:
        """The session's tenant; None if it is the operator's (no file)."""
        return self._owners.get(session_id)

    def owned_by(self, tenant: str) -> frozenset[str]:
        """The ids whose file names ``tenant`` (some may have no session any more)."""
        return frozenset(s for s, owner in self._owners.items() if owner == tenant)

    def assign(self, session_id: str, tenant: str | None) -> None:
        """Give the session to ``tenant`` (None: the operator, its file removed), durably
        before this returns; TenantError if it cannot be done (nothing changed then)."""
        path = os.path.join(self.directory, session_id)
        try:
            if tenant is None:
                if session_id not in self._owners and not os.path.lexists(path):
                    return
                try:
                    os.unlink(path)
                except OSError as exc:
                    if exc.errno not in _GONE:
                        raise
                durable.fsync_dir(self.directory)
            else:
                if not os.path.isdir(self.directory):
                    durable.mkdir(self.directory)
                    durable.fsync_dir(os.path.dirname(self.directory))
                # Staged as ".<id>", a name no session can have: "<id>.tmp" is one, and
                # staging there would replace that session's file.
                staged = os.path.join(self.directory, f".{session_id}")
                fd = durable.create(staged)
                try:
                    durable.write_all(fd, tenant.encode("utf-8") + b"\n", staged)
                    durable.fdatasync(fd, staged)
                finally:
                    durable.close(fd)
                durable.rename(staged, path)
                durable.fsync_dir(self.directory)
        except SessionIOError as exc:
            raise TenantError(path, f"cannot record the tenant: {exc}") from exc
        except OSError as exc:
            raise TenantError(path, f"cannot record the tenant: {exc.strerror or exc}") from exc
        if tenant is None:
            self._owners.pop(session_id, None)
        else:
            self._owners[session_id] = tenant
