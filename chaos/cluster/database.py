"""The database of ``loopd chaos cluster --store postgres``: a PostgreSQL primary and two
standbys with quorum commit, each a host of its own, set up as an HA team sets them up.

Debian's ``postgresql`` server, run as the ``postgres`` user (``setpriv``; the server
refuses root) with its data directory on the host's disk: ``initdb`` on the first host,
``pg_basebackup -X stream -R`` of it on the other two, each started as ``postgres -D``
listening on its host's address, a standby naming itself by its host's name
(``application_name``). Every server runs with ``synchronous_standby_names = 'ANY 1 (pg0,
pg1, pg2)'``: a primary's COMMIT returns once one of its standbys has flushed it (Patroni's
``synchronous_mode`` with a quorum, RDS Multi-AZ's two readable standbys), so the loss of
one standby stops no write, and a promoted standby acknowledges nothing until one of the
others streams to it. Clients reach the bridge's network by ``trust`` in ``pg_hba.conf``:
the namespaces are private to the run.

The faults (``chaos/cluster/faults.py``): ``kill-db-primary`` SIGKILLs every process of the
primary's host; its heal (``chaos/cluster/promotion.py``) promotes the most advanced
standby, re-points the other at it, then rebuilds the old primary as a standby.
``kill-db-standby`` SIGKILLs one standby's host (the two in turn); its heal starts the
server again on its data. Each heal returns once both standbys stream to the primary.
"""

from __future__ import annotations

import glob
import importlib.util
import pwd
import shutil
import time
from pathlib import Path
from typing import Any, Final

from chaos.cluster.netns_hosts import HarnessError, Host

PORT: Final = 5432
USER: Final = "postgres"
DATABASE: Final = "postgres"
SERVERS: Final = 3
"""A primary and two standbys: with ``ANY 1``, either standby alone holds every
acknowledged write."""
READY_TIMEOUT: Final = 60.0
SYNC_TIMEOUT: Final = 90.0
_BINARIES: Final = "/usr/lib/postgresql/*/bin"
_POLL: Final = 0.05
"""Seconds between two looks at the servers' state, against the deadlines above."""
_STREAMING: Final = (
    "SELECT count(*) FROM pg_stat_replication "
    "WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum')"
)


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL server's bin directory, or None."""
    found = [Path(d) for d in glob.glob(_BINARIES) if (Path(d) / "postgres").is_file()]
    found.sort(key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0)
    return found[-1] if found else None


def database_problem() -> str | None:
    """Why ``--store postgres`` cannot run here, in one line, or None."""
    if postgres_bin() is None:
        return f"no PostgreSQL server ({_BINARIES}/postgres): apt-get install -y postgresql"
    if importlib.util.find_spec("psycopg") is None:
        return "no psycopg: pip install 'loopd[postgres]'"
    if shutil.which("setpriv") is None:
        return "no 'setpriv' on PATH (apt-get install -y util-linux)"
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return f"no {USER!r} user (the postgresql package makes it)"
    return None


class ReplicatedDatabase:
    """A primary and two quorum standbys on ``hosts`` (three, each with a disk)."""

    def __init__(self, hosts: list[Host], network: str) -> None:
        assert len(hosts) == SERVERS
        assert all(h.disk is not None for h in hosts)
        self.hosts = hosts
        self.network = network
        self.bin = postgres_bin() or Path(_BINARIES)
        self.primary = 0
        self.standby_kills = 0

    @property
    def standbys(self) -> list[int]:
        return [n for n in range(len(self.hosts)) if n != self.primary]

    def name(self, n: int) -> str:
        return self.hosts[n].name

    def index(self, name: str) -> int:
        return next(n for n, h in enumerate(self.hosts) if h.name == name)

    def standby_to_kill(self) -> int:
        """The standby a ``kill-db-standby`` takes: each in turn."""
        n = self.standbys[self.standby_kills % len(self.standbys)]
        self.standby_kills += 1
        return n

    def quorum(self) -> str:
        """``synchronous_standby_names``: any one of the others (a primary's own name, in
        the list, never streams to it)."""
        return f"ANY 1 ({', '.join(h.name for h in self.hosts)})"

    def uri(self) -> str:
        """Every server; libpq connects to the one that accepts writes."""
        places = ",".join(f"{h.address}:{PORT}" for h in self.hosts)
        return (f"postgresql://{USER}@{places}/{DATABASE}"
                "?target_session_attrs=read-write&connect_timeout=2")  # fmt: skip

    def data(self, n: int, *, inside: bool) -> Path:
        host = self.hosts[n]
        assert host.disk is not None
        return (host.private / "disk" if inside else host.disk) / "pgdata"

    def as_server_user(self, n: int, *argv: str, timeout: float = 120.0) -> None:
        """Run one of the server's programs on host ``n`` as the ``postgres`` user."""
        command = ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--init-groups",
                   str(self.bin / argv[0]), *argv[1:]]  # fmt: skip
        done = self.hosts[n].run(command, timeout=timeout)
        if done.returncode != 0:
            raise HarnessError(f"{argv[0]} on {self.name(n)}: {done.stderr.strip()[-800:]}")

    def start(self) -> None:
        """initdb the primary, start it, base-backup each standby, start it; wait until
        both standbys stream to the primary."""
        for host in self.hosts:
            assert host.disk is not None
            shutil.chown(host.disk, USER, USER)
        data = self.data(0, inside=True)
        self.as_server_user(0, "initdb", "-D", str(data), "-A", "trust", "-U", USER,
                            "-E", "UTF8")  # fmt: skip
        with (self.data(0, inside=False) / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {self.network} trust\n"
                      f"host replication all {self.network} trust\n")  # fmt: skip
        self.launch(0)
        for n in self.standbys:
            self.follow(n)
        self.wait_standbys(len(self.standbys))

    def launch(self, n: int) -> None:
        """``postgres -D`` on host ``n``'s data as it is; returns once it answers."""
        host = self.hosts[n]
        host.spawn(
            ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--init-groups",
             str(self.bin / "postgres"), "-D", str(self.data(n, inside=True)),
             "-c", f"listen_addresses={host.address}", "-p", str(PORT),
             "-c", "unix_socket_directories=", "-c", "fsync=on",
             "-c", f"synchronous_standby_names={self.quorum()}",
             "-c", "max_connections=200"],
            log=host.root / "postgres.log",
        )  # fmt: skip
        deadline = time.monotonic() + READY_TIMEOUT
        while self.query(n, "SELECT 1") != "1":
            if time.monotonic() > deadline:
                log = (host.root / "postgres.log").read_text(errors="replace")[-1500:]
                raise HarnessError(f"PostgreSQL on {host.name} did not start: {log}")
            time.sleep(_POLL)

    def conninfo(self, n: int) -> str:
        """``primary_conninfo`` of standby ``n``: the primary, and ``n``'s own name."""
        primary = self.hosts[self.primary]
        return f"host={primary.address} port={PORT} user={USER} application_name={self.name(n)}"

    def follow(self, n: int) -> None:
        """Host ``n`` a standby of the primary, from a fresh base backup."""
        shutil.rmtree(self.data(n, inside=False), ignore_errors=True)
        primary = self.hosts[self.primary]
        self.as_server_user(n, "pg_basebackup", "-D", str(self.data(n, inside=True)),
                            "-h", primary.address, "-p", str(PORT), "-U", USER,
                            "-X", "stream", "-R", "-c", "fast")  # fmt: skip
        with (self.data(n, inside=False) / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"primary_conninfo = '{self.conninfo(n)}'\n")
        self.launch(n)

    def query(self, n: int, sql: str) -> str | None:
        """``sql``'s one value on host ``n``'s server (psql on that host), or None."""
        host = self.hosts[n]
        done = host.run(["psql", "-X", "-A", "-t", "-h", host.address, "-p", str(PORT),
                         "-U", USER, "-d", DATABASE, "-c", sql], timeout=30)  # fmt: skip
        return done.stdout.strip() if done.returncode == 0 else None

    def wait_standbys(self, count: int, timeout: float = SYNC_TIMEOUT) -> float | None:
        """Seconds until ``count`` standbys stream to the primary as quorum candidates
        (with ``count`` 1: a COMMIT can return); None past ``timeout``."""
        began = time.monotonic()
        while not int(self.query(self.primary, _STREAMING) or 0) >= count:
            if time.monotonic() - began > timeout:
                return None
            time.sleep(_POLL)
        return round(time.monotonic() - began, 3)

    def wait_synchronous(self, count: int) -> float:
        """``wait_standbys``, a HarnessError past ``SYNC_TIMEOUT``."""
        waited = self.wait_standbys(count)
        if waited is None:
            raise HarnessError(f"fewer than {count} synchronous standbys on "
                               f"{self.name(self.primary)} after {SYNC_TIMEOUT:g} s")  # fmt: skip
        return waited

    def restart_standby(self, name: str) -> dict[str, Any]:
        """The killed standby ``name`` started again on its data; what it took until both
        standbys stream again."""
        began = time.monotonic()
        self.launch(self.index(name))
        self.wait_synchronous(len(self.standbys))
        return {"restarted": name, "streaming_again_s": round(time.monotonic() - began, 3)}
