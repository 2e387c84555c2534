"""A PostgreSQL primary with two quorum standbys on loopback, as an HA team sets one up.

Every server runs with ``synchronous_standby_names = 'ANY 1 (pg0, pg1, pg2)'``
(``synchronous_commit`` is ``on`` by default: a COMMIT returns once one standby flushed
it; a server's own name in the list never streams to it). Each standby is
``pg_basebackup -X stream -R`` of the primary as the ``postgres`` user (``-R`` writes
``standby.signal`` and ``primary_conninfo``; the conninfo gets the standby's name as
``application_name``), started on a port of its own. ``kill`` SIGKILLs a server's
postmaster and waits for its server processes to exit (each notices its postmaster's
death); ``promote`` is the failover of ``chaos/cluster/promotion.py`` on loopback, with
that module's choice (``most_advanced``): the most advanced standby promoted
(``pg_ctl promote -w``), the other re-pointed at it by ``ALTER SYSTEM SET
primary_conninfo`` and ``pg_reload_conf()``.
"""

from __future__ import annotations

import os
import signal
from typing import Final

import psutil
import psycopg

from chaos.cluster.promotion import POSITION, most_advanced
from tests.harness.postgres_server import PostgresServer
from tests.harness.support import poll_until

NAMES: Final = ("pg0", "pg1", "pg2")
QUORUM: Final = f"synchronous_standby_names='ANY 1 ({', '.join(NAMES)})'"
"""The setting as ``pg_ctl -o`` passes it (through a shell: quoted)."""
SYNC_TIMEOUT: Final = 60.0
EXIT_TIMEOUT: Final = 30.0
_STREAMING: Final = (
    "SELECT count(*) FROM pg_stat_replication "
    "WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum')"
)


class ReplicatedPostgres:
    """A primary and two quorum standbys; ``stop`` stops all three and removes them."""

    def __init__(self) -> None:
        self.servers = [PostgresServer() for _ in NAMES]
        self.current = 0
        self.positions: dict[int, int] = {}
        """Each standby's WAL position (bytes) when the last promotion chose one."""

    @property
    def primary(self) -> PostgresServer:
        return self.servers[self.current]

    @property
    def standbys(self) -> list[PostgresServer]:
        return [s for n, s in enumerate(self.servers) if n != self.current]

    def start(self) -> None:
        """Start the primary, base-backup each standby from it, wait until both stream."""
        self.primary.start(QUORUM)
        for standby in self.standbys:
            standby.run(
                "pg_basebackup", "-D", str(standby.data), "-h", "127.0.0.1",
                "-p", str(self.primary.port), "-U", "postgres", "-X", "stream", "-R",
            )  # fmt: skip
            with (standby.data / "postgresql.auto.conf").open("a") as conf:
                conf.write(f"primary_conninfo = '{self.conninfo(standby)}'\n")
            standby.launch(QUORUM)
        self.wait_standbys(2)

    def conninfo(self, standby: PostgresServer) -> str:
        """``standby``'s ``primary_conninfo``: the primary, and the standby's own name."""
        name = NAMES[self.servers.index(standby)]
        return f"host=127.0.0.1 port={self.primary.port} user=postgres application_name={name}"

    def wait_standbys(self, count: int) -> None:
        """Until ``count`` standbys stream to the primary as quorum candidates."""
        with psycopg.connect(self.primary.uri(), autocommit=True) as conn:

            def streaming() -> bool:
                row = conn.execute(_STREAMING).fetchone()
                return row is not None and int(row[0]) >= count

            poll_until(streaming, timeout=SYNC_TIMEOUT, what=f"{count} synchronous standbys")

    def uri(self, dbname: str) -> str:
        """Every server, the one that accepts writes chosen (libpq's target_session_attrs)."""
        places = ",".join(f"127.0.0.1:{s.port}" for s in self.servers)
        return (
            f"postgresql://postgres@{places}/{dbname}"
            "?target_session_attrs=read-write&connect_timeout=2"
        )

    def kill(self, server: PostgresServer) -> None:
        """SIGKILL ``server``'s postmaster; wait until every process of it has exited."""
        pid = int((server.data / "postmaster.pid").read_text().split()[0])
        children = psutil.Process(pid).children(recursive=True)
        os.kill(pid, signal.SIGKILL)
        server.started = False  # pg_ctl stop would find no postmaster
        _gone, alive = psutil.wait_procs(children, timeout=EXIT_TIMEOUT)
        for process in alive:
            process.kill()
        psutil.wait_procs(alive, timeout=EXIT_TIMEOUT)

    def kill_primary(self) -> None:
        self.kill(self.primary)

    def promote(self) -> PostgresServer:
        """The most advanced standby promoted (``pg_ctl promote -w`` returns once it accepts
        writes), the other re-pointed at it; the promoted server. Its COMMITs return once
        the re-pointed standby streams to it (not awaited here)."""
        positions = {}
        for standby in self.standbys:
            with psycopg.connect(standby.uri(), autocommit=True) as conn:
                row = conn.execute(POSITION).fetchone()
            assert row is not None
            positions[self.servers.index(standby)] = int(row[0])
        self.positions = positions
        chosen = most_advanced(positions)
        self.servers[chosen].run("pg_ctl", "-D", str(self.servers[chosen].data), "-w", "promote")
        self.current = chosen
        other = next(s for s in self.standbys if s.started)
        with psycopg.connect(other.uri(), autocommit=True) as conn:
            conninfo = self.conninfo(other).replace("'", "''")
            conn.execute(f"ALTER SYSTEM SET primary_conninfo = '{conninfo}'")
            conn.execute("SELECT pg_reload_conf()")
        return self.primary

    def stop(self) -> None:
        """Stop every server (immediate) and remove their directories."""
        errors = []
        for server in self.servers:
            try:
                server.stop()
            except AssertionError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
