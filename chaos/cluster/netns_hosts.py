"""Hosts on one machine: each one a network namespace with a private home.

Used by ``loopd chaos cluster`` and the cluster tests (``tests/harness/netns_hosts.py``
re-exports it). ``Hosts`` makes a bridge namespace (a Linux bridge inside it) and one
namespace per host, joined to the bridge by a veth pair, with an address of
``10.<net>.0.0/24`` assigned inside the namespaces it made: traffic never leaves them
(the machine's own namespace gets no interface and no route). A process started on a
host (``Host.spawn``) runs in that network namespace and in a mount namespace of its
own where ``<host dir>/private`` is a fresh tmpfs holding the host's home and a copy of
its certificates: two hosts share nothing but the network. etcd runs as a host too.
A host made with ``disk=True`` also has a disk that outlives its processes (a directory
of the machine bind-mounted at ``<private>/disk``, every other host's disk hidden under
a tmpfs), so that a host SIGKILLed whole can be started again with its files.

Everything is torn down by ``close`` (SIGTERM, then SIGKILL, every process reaped, every
namespace deleted), also on a failure. Root and ``ip``/``unshare`` are needed:
``namespaces_problem`` says which is missing.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[2]
"""The directory holding the packages: the ``PYTHONPATH`` of every process on a host."""
SETUP_TIMEOUT: Final = 20.0
_SEQUENCE = itertools.count(1)
IP: Final = shutil.which("ip") or "/usr/sbin/ip"
NSENTER: Final = shutil.which("nsenter") or "/usr/bin/nsenter"
PRIVATE: Final = "private"
"""The directory of a host that its mount namespace covers with a tmpfs."""
_MOUNT_AND_EXEC: Final = (
    'set -e; mount -t tmpfs -o "mode=${LOOPD_HOST_MODE:-0700}" loopd-host "$0"; '
    'for p in $(echo "$LOOPD_HOST_COPY" | tr ":" " "); do cp -r "$p" "$0/"; done; '
    'if [ -n "$LOOPD_HOST_DISK" ]; then mkdir "$0/disk"; mount --bind "$LOOPD_HOST_DISK" '
    '"$0/disk"; mount -t tmpfs -o mode=0700 loopd-disks "$LOOPD_HOST_DISKS"; fi; exec "$@"'
)
DISKS: Final = "disks"
"""The directory of the hosts' disks (each host sees only its own, at ``private/disk``)."""


class HarnessError(Exception):
    """The hosts could not be made, or a command on one of them failed (one line)."""


def namespaces_problem() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "mount", "nsenter"):
        if shutil.which(tool) is None:
            return f"no {tool!r} on PATH (apt-get install -y iproute2)"
    probe = f"ldprobe{os.getpid()}"
    made = subprocess.run([IP, "netns", "add", probe], check=False, capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    try:
        mounted = subprocess.run(
            [
                IP,
                "netns",
                "exec",
                probe,
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "mount",
                "-t",
                "tmpfs",
                "probe",
                "/mnt",
            ],
            check=False,
            capture_output=True,
            text=True,
        )
        if mounted.returncode != 0:
            return f"no private mount namespace: {mounted.stderr.strip()}"
    finally:
        subprocess.run([IP, "netns", "del", probe], check=False, capture_output=True)
    return None


def _ip(*args: str, netns: str | None = None) -> None:
    argv = [IP, *(["-n", netns] if netns else []), *args]
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=SETUP_TIMEOUT)
    if done.returncode != 0:
        raise HarnessError(f"{' '.join(argv)}: {done.stderr.strip()}")


@dataclass
class Host:
    """One host: its namespace, address and directory (``private/`` is its own tmpfs)."""

    name: str
    netns: str
    address: str
    root: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    disk: Path | None = None
    """The host's disk as the machine sees it (``disk=True``), else None."""
    interface: str = ""
    """The host's end of its veth pair, inside its namespace."""
    traversable: bool = False
    """Its tmpfs may be passed through by other users (a server that drops root, such as
    PostgreSQL, reaching its data directory on the host's disk): mode 0711, not 0700."""

    @property
    def private(self) -> Path:
        """The path of the host's private tmpfs, as its own processes see it."""
        return self.root / PRIVATE

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run on this host: its network namespace, its mount namespace."""
        return [
            IP,
            "netns",
            "exec",
            self.netns,
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            _MOUNT_AND_EXEC,
            str(self.private),
            *argv,
        ]

    def spawn(
        self, argv: list[str], *, log: Path, copy: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` on this host (``copy``: a directory copied into its tmpfs first);
        its output goes to ``log`` (outside the host: the test reads it)."""
        env = self._env(copy)
        with log.open("ab") as out:
            process = subprocess.Popen(
                self.command(argv),
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.processes.append(process)
        return process

    def run(
        self, argv: list[str], *, timeout: float = 60.0, copy: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on this host to its end; its output."""
        env = self._env(copy)
        return subprocess.run(
            self.command(argv),
            cwd=REPO,
            env=env,
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def _env(self, copy: Path | None) -> dict[str, str]:
        env = {**os.environ, "PYTHONPATH": str(REPO), "LOOPD_HOST_COPY": str(copy or "")}
        env["LOOPD_HOST_MODE"] = "0711" if self.traversable else "0700"
        if self.disk is not None:
            env |= {"LOOPD_HOST_DISK": str(self.disk), "LOOPD_HOST_DISKS": str(self.disk.parent)}
        return env

    def inside(
        self, process: subprocess.Popen[bytes], argv: list[str], *, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in the network and mount namespaces of ``process`` (one spawned on
        this host): it sees that process's private home."""
        assert process in self.processes
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        return subprocess.run(
            [NSENTER, "--target", str(process.pid), "--mount", "--net", *argv],
            cwd=REPO,
            env=env,
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def output_inside(self, process: subprocess.Popen[bytes], argv: list[str]) -> bytes:
        """``inside``, for a command that must exit 0: its stdout as bytes."""
        assert process in self.processes
        return subprocess.run(
            [NSENTER, "--target", str(process.pid), "--mount", "--net", *argv],
            cwd=REPO, check=True, capture_output=True, timeout=60, stdin=subprocess.DEVNULL,
        ).stdout  # fmt: skip

    def kill_all(self) -> None:
        """SIGKILL every process of this host (a host that dies), and reap them."""
        _kill_left_in(self.netns)
        for process in self.processes:
            process.wait()

    def python(self, *args: str) -> list[str]:
        return [sys.executable, *args]


class Hosts:
    """The hosts of one test, on one bridge; ``close`` removes every trace of them."""

    def __init__(self, root: Path, net: int = 77) -> None:
        problem = namespaces_problem()
        if problem is not None:
            raise HarnessError(problem)
        # A home's socket path must fit a Unix socket's 108 bytes, and pytest's own
        # directories grow with their number: the hosts live in a short directory,
        # reached from ``root`` by a link (their logs stay where the test keeps files).
        self._short = tempfile.mkdtemp(prefix="ldh-", dir="/tmp")
        root.parent.mkdir(parents=True, exist_ok=True)
        root.symlink_to(self._short)
        self.root = Path(self._short)
        self.net = net
        self.tag = f"ld{os.getpid() % 100000}x{next(_SEQUENCE)}"
        self.bridge = f"{self.tag}br"
        self.hosts: dict[str, Host] = {}
        self._namespaces: list[str] = []
        try:
            self._namespaces.append(self.bridge)  # first: a stop right after the add
            _ip("netns", "add", self.bridge)  # still finds it to delete
            _ip("link", "add", "br0", "type", "bridge", netns=self.bridge)
            _ip("link", "set", "br0", "up", netns=self.bridge)
        except BaseException:
            self.close()
            raise

    def add(self, name: str, *, disk: bool = False, traversable: bool = False) -> Host:
        """A new host on the bridge, with the next address (``disk``: one of its own that
        outlives its processes; ``traversable``: ``Host.traversable``)."""
        number = len(self.hosts) + 2
        netns = f"{self.tag}{name}"
        inside, outside = f"{self.tag}i{number}"[-15:], f"{self.tag}o{number}"[-15:]
        try:
            self._namespaces.append(netns)
            _ip("netns", "add", netns)
            _ip(
                "link",
                "add",
                inside,
                "netns",
                netns,
                "type",
                "veth",
                "peer",
                "name",
                outside,
                "netns",
                self.bridge,
            )
            _ip("link", "set", outside, "master", "br0", "up", netns=self.bridge)
            address = f"10.{self.net}.0.{number}"
            _ip("addr", "add", f"{address}/24", "dev", inside, netns=netns)
            _ip("link", "set", inside, "up", netns=netns)
            _ip("link", "set", "lo", "up", netns=netns)
        except BaseException:
            self.close()
            raise
        root = self.root / name
        (root / PRIVATE).mkdir(parents=True, exist_ok=True)
        host = Host(name=name, netns=netns, address=address, root=root, interface=inside,
                    traversable=traversable)  # fmt: skip
        if traversable:
            os.chmod(self.root, 0o711)  # noqa: S103 - mkdtemp's 0700 stops the server's user
        if disk:
            host.disk = self.root / DISKS / name
            host.disk.mkdir(parents=True, exist_ok=True)
        self.hosts[name] = host
        return host

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """SIGTERM every process, SIGKILL what is left after a deadline, reap, delete."""
        processes = [p for host in self.hosts.values() for p in host.processes]
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.send_signal(signal.SIGCONT)  # one stopped by a fault
        for process in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        # Every host's processes die before any namespace is deleted: a process of one
        # host, in a mount namespace of its own, holds a copy of every /run/netns mount
        # that existed when it started, and while it lives the file of a deleted
        # namespace cannot be removed (EBUSY): the namespace would be left behind.
        for netns in self._namespaces:
            _kill_left_in(netns)
        deadline = time.monotonic() + SETUP_TIMEOUT
        left = list(reversed(self._namespaces))
        while left:
            left = [netns for netns in left if not _deleted(netns)]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.05)  # a SIGKILLed process is still exiting
        self._namespaces.clear()
        shutil.rmtree(self._short, ignore_errors=True)
        if left:
            raise HarnessError(f"namespaces not deleted: {', '.join(left)}")


def _deleted(netns: str) -> bool:
    """Delete ``netns`` if nothing runs in it any more; whether it is gone."""
    found = subprocess.run([IP, "netns", "pids", netns], check=False, capture_output=True,
                           text=True, timeout=SETUP_TIMEOUT)  # fmt: skip
    if found.returncode == 0 and found.stdout.split():
        _kill_left_in(netns)
        return False
    subprocess.run([IP, "netns", "del", netns], check=False, capture_output=True,
                   timeout=SETUP_TIMEOUT)  # fmt: skip
    return not os.path.exists(f"/run/netns/{netns}")


def _kill_left_in(netns: str) -> None:
    """SIGKILL and reap any process still in ``netns`` (a worker whose daemon was killed)."""
    found = subprocess.run(
        [IP, "netns", "pids", netns], check=False, capture_output=True, text=True
    )
    for pid in found.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            continue
        with contextlib.suppress(ChildProcessError):  # not ours: its parent reaps it
            os.waitpid(int(pid), 0)
