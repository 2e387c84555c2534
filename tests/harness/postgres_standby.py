"""A PostgreSQL primary with a synchronous standby on loopback, as an operator sets one up.

The primary names ``standby1`` in ``synchronous_standby_names`` (``synchronous_commit``
is ``on`` by default: a COMMIT returns once the standby flushed it). The standby is
``pg_basebackup -X stream -R`` of the primary as the ``postgres`` user (``-R`` writes
``standby.signal`` and ``primary_conninfo``; the conninfo gets ``application_name``
``standby1`` so the primary knows it by that name), started on a port of its own.
``kill_primary`` SIGKILLs the primary's postmaster and waits for its server processes
to exit (each notices its postmaster's death); ``promote`` is ``pg_ctl promote -w``.
"""

from __future__ import annotations

import os
import signal
from typing import Final

import psutil
import psycopg

from tests.harness.postgres_server import PostgresServer
from tests.harness.support import poll_until

STANDBY_NAME: Final = "standby1"
SYNC_TIMEOUT: Final = 60.0
EXIT_TIMEOUT: Final = 30.0


class ReplicatedPostgres:
    """A primary and its synchronous standby; ``stop`` stops both and removes them."""

    def __init__(self) -> None:
        self.primary = PostgresServer()
        self.standby = PostgresServer()

    def start(self) -> None:
        """Start the primary, base-backup the standby from it, wait until it is synchronous."""
        self.primary.start(f"synchronous_standby_names={STANDBY_NAME}")
        self.standby.run(
            "pg_basebackup", "-D", str(self.standby.data), "-h", "127.0.0.1",
            "-p", str(self.primary.port), "-U", "postgres", "-X", "stream", "-R",
        )  # fmt: skip
        conninfo = (
            f"host=127.0.0.1 port={self.primary.port} user=postgres application_name={STANDBY_NAME}"
        )
        with (self.standby.data / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"primary_conninfo = '{conninfo}'\n")
        self.standby.launch()
        self._wait_synchronous()

    def _wait_synchronous(self) -> None:
        with psycopg.connect(self.primary.uri(), autocommit=True) as conn:

            def synchronous() -> bool:
                row = conn.execute(
                    "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                    (STANDBY_NAME,),
                ).fetchone()
                return row is not None and row[0] == "sync"

            poll_until(synchronous, timeout=SYNC_TIMEOUT, what="the standby to be synchronous")

    def uri(self, dbname: str) -> str:
        """Both servers, the one that accepts writes chosen (libpq's target_session_attrs)."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
            f"/{dbname}?target_session_attrs=read-write&connect_timeout=2"
        )

    def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster; wait until every process of it has exited."""
        pid = int((self.primary.data / "postmaster.pid").read_text().split()[0])
        children = psutil.Process(pid).children(recursive=True)
        os.kill(pid, signal.SIGKILL)
        self.primary.started = False  # pg_ctl stop would find no postmaster
        _gone, alive = psutil.wait_procs(children, timeout=EXIT_TIMEOUT)
        for process in alive:
            process.kill()
        psutil.wait_procs(alive, timeout=EXIT_TIMEOUT)

    def promote(self) -> None:
        """pg_ctl promote -w: it returns once the standby accepts writes."""
        self.standby.run("pg_ctl", "-D", str(self.standby.data), "-w", "promote")

    def stop(self) -> None:
        """Stop both servers (immediate) and remove their directories."""
        try:
            self.standby.stop()
        finally:
            self.primary.stop()
