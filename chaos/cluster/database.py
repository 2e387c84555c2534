"""The database of ``loopd chaos cluster --store postgres``: a PostgreSQL primary and its
synchronous standby, each a host of its own, set up as an operator sets them up.

Debian's ``postgresql`` server, run as the ``postgres`` user (``setpriv``; the server
refuses root) with its data directory on the host's disk: ``initdb`` on the first host,
``pg_basebackup -X stream -R`` of it on the second, both started as ``postgres -D``
listening on their host's address. Both run with ``synchronous_standby_names = '*'``: a
primary's COMMIT returns once a standby has flushed it, and a promoted standby waits for
the next one before it acknowledges anything (PostgreSQL's own rule; Patroni calls it
``synchronous_mode_strict``). Clients reach the bridge's network by ``trust`` in
``pg_hba.conf``: the namespaces are private to the run.

The faults (``chaos/cluster/faults.py``): ``kill-db-primary`` SIGKILLs every process of the
primary's host; its heal promotes the standby (``pg_ctl promote -w``), then makes the old
primary a standby of the new one from a fresh base backup (its own WAL may hold
transactions the standby never had: it is not reused, as ``pg_rewind`` would not be
without ``wal_log_hints``). ``kill-db-standby`` SIGKILLs the standby's host; its heal
starts the server again on its data. Each heal returns once a standby is synchronous.
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
READY_TIMEOUT: Final = 60.0
SYNC_TIMEOUT: Final = 90.0
_BINARIES: Final = "/usr/lib/postgresql/*/bin"
_POLL: Final = 0.1
"""Seconds between two looks at the server's state, against the deadlines above."""


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
    """A primary and a synchronous standby on ``hosts`` (two, each with a disk)."""

    def __init__(self, hosts: list[Host], network: str) -> None:
        assert len(hosts) == 2
        assert all(h.disk is not None for h in hosts)
        self.hosts = hosts
        self.network = network
        self.bin = postgres_bin() or Path(_BINARIES)
        self.primary = 0

    @property
    def standby(self) -> int:
        return 1 - self.primary

    def name(self, n: int) -> str:
        return self.hosts[n].name

    def uri(self) -> str:
        """Both servers; libpq connects to the one that accepts writes."""
        places = ",".join(f"{h.address}:{PORT}" for h in self.hosts)
        return (f"postgresql://{USER}@{places}/{DATABASE}"
                "?target_session_attrs=read-write&connect_timeout=2")  # fmt: skip

    def _data(self, n: int, *, inside: bool) -> Path:
        host = self.hosts[n]
        assert host.disk is not None
        return (host.private / "disk" if inside else host.disk) / "pgdata"

    def _as_server_user(self, n: int, *argv: str, timeout: float = 120.0) -> None:
        """Run one of the server's programs on host ``n`` as the ``postgres`` user."""
        command = ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--init-groups",
                   str(self.bin / argv[0]), *argv[1:]]  # fmt: skip
        done = self.hosts[n].run(command, timeout=timeout)
        if done.returncode != 0:
            raise HarnessError(f"{argv[0]} on {self.name(n)}: {done.stderr.strip()[-800:]}")

    def start(self) -> None:
        """initdb the primary, start it, base-backup the standby, start it; wait until the
        standby is synchronous."""
        for host in self.hosts:
            assert host.disk is not None
            shutil.chown(host.disk, USER, USER)
        data = self._data(0, inside=True)
        self._as_server_user(0, "initdb", "-D", str(data), "-A", "trust", "-U", USER,
                             "-E", "UTF8")  # fmt: skip
        with (self._data(0, inside=False) / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {self.network} trust\n"
                      f"host replication all {self.network} trust\n")  # fmt: skip
        self._launch(0)
        self._follow(1)
        self.wait_synchronous()

    def _launch(self, n: int) -> None:
        host = self.hosts[n]
        host.spawn(
            ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--init-groups",
             str(self.bin / "postgres"), "-D", str(self._data(n, inside=True)),
             "-c", f"listen_addresses={host.address}", "-p", str(PORT),
             "-c", "unix_socket_directories=", "-c", "fsync=on",
             "-c", "synchronous_standby_names=*", "-c", "max_connections=200"],
            log=host.root / "postgres.log",
        )  # fmt: skip
        deadline = time.monotonic() + READY_TIMEOUT
        while self._query(n, "SELECT 1") != "1":
            if time.monotonic() > deadline:
                log = (host.root / "postgres.log").read_text(errors="replace")[-1500:]
                raise HarnessError(f"PostgreSQL on {host.name} did not start: {log}")
            time.sleep(_POLL)

    def _follow(self, n: int) -> None:
        """Host ``n`` a standby of the primary, from a fresh base backup."""
        shutil.rmtree(self._data(n, inside=False), ignore_errors=True)
        primary = self.hosts[self.primary]
        self._as_server_user(n, "pg_basebackup", "-D", str(self._data(n, inside=True)),
                             "-h", primary.address, "-p", str(PORT), "-U", USER,
                             "-X", "stream", "-R", "-c", "fast")  # fmt: skip
        with (self._data(n, inside=False) / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"primary_conninfo = 'host={primary.address} port={PORT} user={USER} "
                       f"application_name={self.name(n)}'\n")  # fmt: skip
        self._launch(n)

    def _query(self, n: int, sql: str) -> str | None:
        """``sql``'s one value on host ``n``'s server (psql on that host), or None."""
        host = self.hosts[n]
        done = host.run(["psql", "-X", "-A", "-t", "-h", host.address, "-p", str(PORT),
                         "-U", USER, "-d", DATABASE, "-c", sql], timeout=30)  # fmt: skip
        return done.stdout.strip() if done.returncode == 0 else None

    def wait_synchronous(self) -> float:
        """Seconds until the primary names a synchronous standby (HarnessError past the
        deadline)."""
        began = time.monotonic()
        sql = "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
        while self._query(self.primary, sql) != "1":
            if time.monotonic() - began > SYNC_TIMEOUT:
                raise HarnessError(f"no synchronous standby on {self.name(self.primary)} "
                                   f"after {SYNC_TIMEOUT:g} s")  # fmt: skip
            time.sleep(_POLL)
        return round(time.monotonic() - began, 3)

    def promote(self) -> dict[str, Any]:
        """The standby promoted (``pg_ctl promote -w``), the old primary made its standby;
        what it took."""
        began = time.monotonic()
        old = self.primary
        data = str(self._data(self.standby, inside=True))
        self._as_server_user(self.standby, "pg_ctl", "-D", data, "-w", "promote")
        self.primary = self.standby
        promoted_at = time.monotonic()
        promoted = round(promoted_at - began, 3)
        self._follow(old)
        synchronous = self.wait_synchronous()
        return {"promoted": self.name(self.primary), "promote_s": promoted,
                "promoted_at": promoted_at,
                "writes_wait_s": round(time.monotonic() - began, 3),
                "sync_wait_s": synchronous}  # fmt: skip

    def restart_standby(self) -> dict[str, Any]:
        """The killed standby started again on its data; what it took to be synchronous."""
        began = time.monotonic()
        self._launch(self.standby)
        self.wait_synchronous()
        return {"restarted": self.name(self.standby),
                "writes_wait_s": round(time.monotonic() - began, 3)}  # fmt: skip
