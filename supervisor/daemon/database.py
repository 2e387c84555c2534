"""``serve --store postgresql://...``: the database checked at start, and its sessions listed.

With a store the sessions live in the database; the home keeps the control socket, the
logs, the intent and hosting files. At start serve creates or migrates the schema (a
newer one is refused), reads what a COMMIT promises (``synchronous_commit``,
``synchronous_standby_names``) and says it in one line, refuses a server without
synchronous replication under ``--require-sync-replication``, lists the sessions, and
(one node alone) reads the App each session's newest SessionStart names, in one query,
for its status row until its worker reports (supervisor.hosting.epoch_apps). Each of
those is one short connection, closed before the first worker is forked: a worker
connects on its own, after its fork. psycopg is imported here only with a store.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from supervisor.daemon.config import ServeConfig
from supervisor.daemon.home import existing_sessions
from supervisor.errors import ServeError
from supervisor.hosting.epoch_apps import remember_stored
from worker.store.errors import PathError

if TYPE_CHECKING:
    from worker.store.postgres import PostgresStore

NOT_YET: Final = frozenset({None, "57P03", "53300"})
"""SQLSTATEs of a database that may answer soon: none (refused, unreachable, timed out),
starting up or shutting down (57P03), no connection free (53300). Anything else (a
password refused, no such database) is refused at once, --store-wait or not."""
_WAIT_PAUSE: Final = 1.0
_SAY_EVERY: Final = 10.0


def hosted_sessions(config: ServeConfig, home: str, report: Callable[[str], None]) -> list[str]:
    """The ids of the sessions serve hosts: the home's, or its database's (checked first)."""
    if not config.store:
        if config.require_sync_replication:
            raise ServeError("--require-sync-replication needs --store postgresql://...")
        return existing_sessions(home)
    from worker.store.postgres import PostgresStore  # noqa: PLC0415 - psycopg only with a store

    try:
        store = PostgresStore(config.store)
        version = _schema(store, config.store_wait, report)
        durability = store.durability()
        sessions = store.session_ids()
        if config.cluster is None:  # a node's sessions are etcd's, and may move in later
            remember_stored(config.store, store.newest_starts())
    except PathError as exc:  # unreachable, not a URI, no driver, a newer schema
        raise ServeError(f"--store: {exc}") from exc
    report(f"sessions in {store.place} (schema version {version}): {durability.promise()}")
    if config.require_sync_replication and not durability.synchronous:
        raise ServeError(
            f"{store.place}: --require-sync-replication: the server does not replicate "
            f"synchronously (synchronous_commit={durability.synchronous_commit}, "
            f"synchronous_standby_names={durability.synchronous_standby_names!r}); "
            "set both on the primary (docs/scaling.md), or start without the flag"
        )
    return sessions  # a cluster node serves those etcd places on it (supervisor.node.stored)


def _schema(store: PostgresStore, wait: float, report: Callable[[str], None]) -> int:
    """``store.ensure_schema()``; with ``wait``, tried again for that many seconds while
    the database does not answer yet (``NOT_YET``), saying so every ``_SAY_EVERY`` s."""
    from worker.store.postgres import DatabaseUnavailable  # noqa: PLC0415 - with a store
    from worker.store.postgres.connection import driver  # noqa: PLC0415 - with a store

    deadline = time.monotonic() + wait
    said = 0.0
    while True:
        try:
            return store.ensure_schema()
        except DatabaseUnavailable as exc:
            cause = exc.__cause__  # the server's or the network's; not a URI psycopg refused
            answers_later = isinstance(cause, driver().OperationalError)
            if not answers_later or getattr(cause, "sqlstate", None) not in NOT_YET:
                raise
            if time.monotonic() >= deadline:
                raise
            if time.monotonic() >= said:
                left = deadline - time.monotonic()
                report(f"--store: {exc}: waiting for it ({left:.0f} s more, --store-wait)")
                said = time.monotonic() + _SAY_EVERY
            time.sleep(min(_WAIT_PAUSE, max(0.0, deadline - time.monotonic())))
