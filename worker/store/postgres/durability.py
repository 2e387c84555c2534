"""What a COMMIT's return promises: the server's synchronous replication settings, read.

A write is acknowledged once its COMMIT returned. Whether that survives the loss of the
primary is the server's configuration, not loopd's: ``synchronous_commit`` (``on``,
``remote_write``, ``remote_apply``: the standby confirms; ``local``, ``off``: it does not)
with ``synchronous_standby_names`` naming the standbys that must confirm (empty: none
does, whatever ``synchronous_commit`` says). ``loopd serve --store`` logs this at start,
and ``--require-sync-replication`` refuses to start without it (docs/scaling.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from worker.store.postgres.connection import Connection

_WAITS_FOR_STANDBY: Final = frozenset({"on", "remote_write", "remote_apply"})
_SETTINGS: Final = ("synchronous_commit", "synchronous_standby_names")


@dataclass(frozen=True, slots=True, kw_only=True)
class Durability:
    """The two settings as the server reports them to this connection's role and database."""

    synchronous_commit: str
    synchronous_standby_names: str

    @property
    def synchronous(self) -> bool:
        """True if a COMMIT returns only once a named standby confirmed it."""
        return (
            self.synchronous_commit in _WAITS_FOR_STANDBY
            and self.synchronous_standby_names.strip() != ""
        )

    def promise(self) -> str:
        """One line for the operator: the settings and what an acknowledged write survives."""
        settings = (
            f"synchronous_commit={self.synchronous_commit}, "
            f"synchronous_standby_names={self.synchronous_standby_names!r}"
        )
        if self.synchronous:
            return (
                f"{settings}: an acknowledged write is on a synchronous standby too "
                "(the primary's loss loses none of them)"
            )
        if self.synchronous_commit == "off":
            return (
                f"{settings}: a COMMIT returns before the primary's WAL is flushed "
                "(a crash of the database server may lose acknowledged writes)"
            )
        return (
            f"{settings}: no synchronous standby, an acknowledged write is on the primary's "
            "disk alone (the primary's loss may lose acknowledged writes)"
        )


def read_durability(conn: Connection) -> Durability:
    """SHOW the two settings on ``conn``."""
    values = []
    for name in _SETTINGS:
        row = conn.execute(f"SHOW {name}").fetchone()
        values.append("" if row is None else str(row[0]))
    return Durability(synchronous_commit=values[0], synchronous_standby_names=values[1])
