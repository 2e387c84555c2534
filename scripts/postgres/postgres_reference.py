"""A PostgreSQL server for the benchmarks, started as tests/harness/postgres_server.py starts one.

Debian's ``postgresql`` package: ``initdb`` into a temporary directory (as the
``postgres`` user when run as root: initdb refuses root), ``pg_ctl start -w`` on a unix
socket in that directory and no TCP port, ``pg_ctl stop -m immediate`` and the
directory removed at the end. A benchmark script imports this, never ``tests``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Final

START_TIMEOUT: Final = 60
BINARIES: Final = "/usr/lib/postgresql/*/bin"
INSTALL: Final = f"no PostgreSQL server binaries ({BINARIES}): apt-get install postgresql"
_SERVER_USER: Final = "postgres"
_PORT: Final = 5432  # only names the socket file: listen_addresses is empty


class ReferenceServer:
    """One PostgreSQL cluster in a temporary directory under ``parent``; ``stop`` removes it."""

    def __init__(self, parent: str | None = None) -> None:
        found = sorted(
            (Path(d) for d in glob.glob(BINARIES) if (Path(d) / "initdb").is_file()),
            key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0,
        )
        if not found:
            raise SystemExit(INSTALL)
        self.bin = found[-1]
        self.root = Path(tempfile.mkdtemp(prefix="loopd-pg-bench-", dir=parent))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.user: str | None = None
        if os.geteuid() == 0:
            self.user = _SERVER_USER
            account = pwd.getpwnam(_SERVER_USER)
            os.chown(self.root, account.pw_uid, account.pw_gid)
        self.started = False

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
            raise RuntimeError(f"{argv[0]} failed: {done.stdout}{done.stderr}{log}")

    def start(self) -> None:
        """initdb, then pg_ctl start -w (it returns once the server accepts connections)."""
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8")
        options = f"-p {_PORT} -c listen_addresses='' -k {self.root} -c fsync=on"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")
        self.started = True

    def uri(self, dbname: str = "postgres") -> str:
        """A libpq URI of database ``dbname`` over the server's unix socket."""
        return f"postgresql://postgres@/{dbname}?host={self.root}&port={_PORT}"

    def pid(self) -> int:
        """The postmaster's pid (the first line of postmaster.pid)."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def stop(self) -> None:
        """pg_ctl stop -m immediate (every server process exits), then remove the directory."""
        try:
            if self.started:
                self.started = False
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
