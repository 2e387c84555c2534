"""A real PostgreSQL server on loopback for the store's tests, started as a user would.

Debian's ``postgresql`` package (``.ci/run`` installs it): ``initdb`` into a temporary
directory owned by the ``postgres`` user (initdb refuses root), ``pg_ctl start -w``
listening on 127.0.0.1 at a free port and on a unix socket in that directory, and
``pg_ctl stop -m immediate`` with the directory removed at the end. Without the
binaries (or the driver) a test skips on a developer's machine and fails under
``CI=true``, as the etcd tests do.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Final

import pytest

from tests.harness.etcd_server import free_port

START_TIMEOUT: Final = 60
_BINARIES: Final = "/usr/lib/postgresql/*/bin"
_SERVER_USER: Final = "postgres"


def _missing(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


def postgres_bin() -> Path:
    """The newest installed PostgreSQL's bin directory; skip (fail under CI) without one."""
    if importlib.util.find_spec("psycopg") is None:
        _missing("no psycopg: pip install -e '.[test,postgres]'")
    found = sorted(
        (Path(d) for d in glob.glob(_BINARIES) if (Path(d) / "initdb").is_file()),
        key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0,
    )
    if not found:
        _missing(f"no PostgreSQL server binaries ({_BINARIES}): apt-get install postgresql")
    return found[-1]


class PostgresServer:
    """One PostgreSQL cluster in a temporary directory; ``stop`` removes it all."""

    def __init__(self) -> None:
        self.bin = postgres_bin()
        self.root = Path(tempfile.mkdtemp(prefix="loopd-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self.user: str | None = None
        if os.geteuid() == 0:
            # initdb refuses root: the cluster belongs to the postgres user, as packaged.
            self.user = _SERVER_USER
            account = pwd.getpwnam(_SERVER_USER)
            os.chown(self.root, account.pw_uid, account.pw_gid)
        self.started = False

    def run(self, *argv: str) -> None:
        """Run one of the server's programs as the cluster's user; AssertionError if it fails."""
        self._run(*argv)

    def _run(self, *argv: str) -> None:
        done = subprocess.run(
            [str(self.bin / argv[0]), *argv[1:]],
            user=self.user,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
            check=False,
            cwd=self.root,
        )
        if done.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise AssertionError(f"{argv[0]} failed: {done.stdout}{done.stderr}{log}")

    def start(self, *settings: str) -> None:
        """initdb, then pg_ctl start -w (it returns once the server accepts connections).

        ``settings`` are more ``name=value`` server settings (a primary's
        ``synchronous_standby_names``, tests/harness/postgres_standby.py).
        """
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8")
        self.launch(*settings)

    def launch(self, *settings: str) -> None:
        """pg_ctl start -w on the data directory as it is (made by initdb or pg_basebackup)."""
        options = f"-p {self.port} -h 127.0.0.1 -k {self.root} -c fsync=on -c max_connections=50"
        options += "".join(f" -c {setting}" for setting in settings)
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")
        self.started = True

    def uri(self, dbname: str = "postgres") -> str:
        """A libpq URI of database ``dbname`` on this server."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def new_database(self) -> str:
        """Create an empty database and return its URI (each test gets its own)."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.uri(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.uri(name)

    def stop(self) -> None:
        """pg_ctl stop -m immediate (every server process exits), then remove the directory."""
        try:
            if self.started:
                self.started = False
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
