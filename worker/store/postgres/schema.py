"""The PostgreSQL store's tables, versioned: created at first use, migrated forward, never back.

``loopd_schema`` holds one row, the version the tables are at. A database whose version
is newer than this code's is refused in one line (an older loopd must not write a layout
it does not know); an older one is migrated step by step under a transaction-scoped
advisory lock, so concurrent first users create it once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from worker.store.postgres.connection import driver
from worker.store.postgres.errors import SchemaTooNew

if TYPE_CHECKING:
    import psycopg

SCHEMA_VERSION: Final = 1
# pg_advisory_xact_lock's key for migrations: "loopd" in ASCII, any fixed number would do.
_MIGRATION_LOCK: Final = 0x6C6F6F7064

# Each step takes the schema from version i to i + 1 (docs/format.md, "In PostgreSQL").
_STEPS: Final[tuple[tuple[str, ...], ...]] = (
    (
        """CREATE TABLE loopd_sessions (
            session text PRIMARY KEY,
            owner_token bigint NOT NULL CHECK (owner_token > 0)
        )""",
        """CREATE TABLE loopd_files (
            session text NOT NULL REFERENCES loopd_sessions ON DELETE CASCADE,
            name text NOT NULL,
            data bytea NOT NULL,
            PRIMARY KEY (session, name)
        )""",
        """CREATE TABLE loopd_log_chunks (
            session text NOT NULL REFERENCES loopd_sessions ON DELETE CASCADE,
            epoch integer NOT NULL CHECK (epoch >= 0),
            start bigint NOT NULL CHECK (start >= 0),
            data bytea NOT NULL,
            PRIMARY KEY (session, epoch, start)
        )""",
    ),
)


def schema_version(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    """The version the database's tables are at; 0 when loopd has not created them."""
    row = conn.execute("SELECT to_regclass('loopd_schema') IS NOT NULL").fetchone()
    if row is None or not row[0]:
        return 0
    found = conn.execute("SELECT version FROM loopd_schema").fetchone()
    return 0 if found is None else int(str(found[0]))


def ensure_schema(conn: psycopg.Connection[tuple[object, ...]], place: str) -> int:
    """Create or migrate loopd's tables to SCHEMA_VERSION; SchemaTooNew if they are newer.

    ``conn`` is in autocommit mode: its first statement, outside any transaction, may fail.
    """
    if _checked(_version_at_once(conn), place):
        return SCHEMA_VERSION
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS loopd_schema ("
            "only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row), "
            "version integer NOT NULL)"
        )
        version = schema_version(conn)  # again, under the lock: another user may have won
        if not _checked(version, place):
            for steps in _STEPS[version:]:
                for statement in steps:
                    conn.execute(statement)
            conn.execute(
                "INSERT INTO loopd_schema (version) VALUES (%s) "
                "ON CONFLICT (only_row) DO UPDATE SET version = EXCLUDED.version",
                (SCHEMA_VERSION,),
            )
    return SCHEMA_VERSION


def _version_at_once(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    """``schema_version`` in one round trip where the tables exist (every open's case)."""
    try:
        found = conn.execute("SELECT version FROM loopd_schema").fetchone()
    except driver().errors.UndefinedTable:
        return 0  # autocommit: the failed statement left no transaction behind
    return 0 if found is None else int(str(found[0]))


def _checked(version: int, place: str) -> bool:
    """True if ``version`` is current; SchemaTooNew if it is newer than this code's."""
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(place, version, SCHEMA_VERSION)
    return version == SCHEMA_VERSION
