"""The PostgreSQL store's errors, in the store's family (``worker.store.errors``)."""

from __future__ import annotations

from worker.store.errors import PathError


class SchemaTooNew(PathError):
    """The database's loopd tables are of a newer version than this code knows."""

    def __init__(self, path: str, version: int, known: int) -> None:
        super().__init__(path, f"schema version {version} is newer than this loopd's ({known})")
        self.version = version
        self.known = known

    def __reduce__(self) -> tuple[type[SchemaTooNew], tuple[str, int, int]]:
        return (type(self), (self.path, self.version, self.known))


class DatabaseUnavailable(PathError):
    """A statement of the store failed in the database or on the way (the outcome unknown)."""

    def __str__(self) -> str:
        return f"{self.path}: database error: {self.why}"


class OutcomeUnknown(DatabaseUnavailable):
    """The connection was lost while a transaction committed: it may or may not have."""

    def __str__(self) -> str:
        return (
            f"{self.path}: the connection was lost while the transaction committed ({self.why}):"
            " it may or may not be in the database"
        )


class LostBeforeWrite(DatabaseUnavailable):
    """The connection was lost before a write was sent: nothing of it reached the database
    (the outcome is known, unlike a connection lost during a write)."""


class PostgresNotInstalled(PathError):
    """A postgresql:// store was named but the driver is missing."""
