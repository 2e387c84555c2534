"""A failover of the database of ``loopd chaos cluster --store postgres``, as an HA team's
tooling runs it (Patroni's quorum mode): the primary is lost, two standbys remain.

1. The most advanced standby is chosen: the greater of ``pg_last_wal_receive_lsn()``
   and ``pg_last_wal_replay_lsn()`` on each (WAL is one stream: the one further along
   holds all the other holds). With ``ANY 1`` every acknowledged COMMIT is flushed on
   at least one standby, so the most advanced holds every one of them.
2. It is promoted (``pg_ctl promote -w``): a new timeline.
3. The other standby is re-pointed at it: ``ALTER SYSTEM SET primary_conninfo`` and
   ``pg_reload_conf()`` (PostgreSQL 13 and later restart the WAL receiver on the new
   setting; ``recovery_target_timeline = 'latest'``, the default, follows the promotion's
   timeline without a restart). If it does not stream within ``REPOINT_TIMEOUT``, the
   standby is restarted; failing that, rebuilt from a base backup. Once it streams, the
   new primary's COMMITs return: writes resume.
4. The old primary is rebuilt as a standby of the new one from a fresh base backup (its
   WAL may hold transactions no standby had: it is not reused, as ``pg_rewind`` would
   not be without ``wal_log_hints``), after writes resumed.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final

from chaos.cluster.netns_hosts import HarnessError

if TYPE_CHECKING:
    from chaos.cluster.database import ReplicatedDatabase

REPOINT_TIMEOUT: Final = 5.0
"""Seconds a re-pointed standby is given to stream to the new primary before it is
restarted (then as long again before it is rebuilt)."""
POSITION: Final = (
    "SELECT pg_wal_lsn_diff(GREATEST(COALESCE(pg_last_wal_receive_lsn(), '0/0'), "
    "COALESCE(pg_last_wal_replay_lsn(), '0/0')), '0/0')::bigint"
)
"""A standby's WAL position in bytes: what it received and flushed, or replayed (after
a restart, before its receiver connects, only the replay position is known)."""


def positions(db: ReplicatedDatabase) -> dict[int, int]:
    """Each standby's WAL position in bytes; HarnessError if one does not answer (it may
    be the only one holding the newest acknowledged writes: promoting the other could
    lose them, a choice for an operator, not for the rig)."""
    found = {}
    for n in db.standbys:
        said = db.query(n, POSITION)
        if said is None or not said.isdigit():
            raise HarnessError(f"{db.name(n)} does not tell its WAL position ({said!r}): "
                               "no standby is promoted")  # fmt: skip
        found[n] = int(said)
    return found


def most_advanced(found: dict[int, int]) -> int:
    """The standby furthest along (ties: the lower host number); HarnessError if none."""
    if not found:
        raise HarnessError("no standby answers: none can be promoted")
    return max(found, key=lambda n: (found[n], -n))


def repoint(db: ReplicatedDatabase, n: int) -> str:
    """Standby ``n`` streaming from the new primary; how: "reload", "restart" or
    "base backup"."""
    conninfo = db.conninfo(n).replace("'", "''")
    for sql in (f"ALTER SYSTEM SET primary_conninfo = '{conninfo}'", "SELECT pg_reload_conf()"):
        if db.query(n, sql) is None:
            raise HarnessError(f"{sql} on {db.name(n)} failed")
    if db.wait_standbys(1, REPOINT_TIMEOUT) is not None:
        return "reload"
    data = str(db.data(n, inside=True))
    db.as_server_user(n, "pg_ctl", "-D", data, "-m", "fast", "-w", "stop")
    db.launch(n)
    if db.wait_standbys(1, REPOINT_TIMEOUT) is not None:
        return "restart"
    db.as_server_user(n, "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
    db.follow(n)
    db.wait_synchronous(1)
    return "base backup"


def fail_over(db: ReplicatedDatabase) -> dict[str, Any]:
    """Steps 1 to 4 of the module's text; what each took (``promoted_at``: when the new
    primary accepted writes, on the machine's monotonic clock)."""
    began = time.monotonic()
    old = db.primary
    found = positions(db)
    chosen = most_advanced(found)
    db.as_server_user(chosen, "pg_ctl", "-D", str(db.data(chosen, inside=True)), "-w",
                      "promote")  # fmt: skip
    db.primary = chosen
    promoted_at = time.monotonic()
    other = next(n for n in db.standbys if n != old)
    way = repoint(db, other)
    synchronous_at = time.monotonic()
    db.follow(old)
    db.wait_synchronous(len(db.standbys))
    return {"promoted": db.name(chosen), "positions": {db.name(n): p for n, p in found.items()},
            "promote_s": round(promoted_at - began, 3), "promoted_at": promoted_at,
            "repointed": db.name(other), "repointed_by": way,
            "sync_after_promotion_s": round(synchronous_at - promoted_at, 3),
            "writes_wait_s": round(synchronous_at - began, 3),
            "rebuilt": db.name(old),
            "rebuilt_s": round(time.monotonic() - synchronous_at, 3)}  # fmt: skip
