"""Sessions in PostgreSQL behind the store's backend seam (docs/format.md, "In PostgreSQL").

Importing this package does not import the driver: psycopg is imported at the first
connection (``pip install 'loopd[postgres]'``).
"""

from __future__ import annotations

from worker.store.postgres.durability import Durability
from worker.store.postgres.errors import DatabaseUnavailable, PostgresNotInstalled, SchemaTooNew
from worker.store.postgres.schema import SCHEMA_VERSION
from worker.store.postgres.session import PostgresSession
from worker.store.postgres.store import PostgresStore

__all__ = [
    "SCHEMA_VERSION",
    "DatabaseUnavailable",
    "Durability",
    "PostgresNotInstalled",
    "PostgresSession",
    "PostgresStore",
    "SchemaTooNew",
]
