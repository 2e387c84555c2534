"""Four ``loopd serve`` nodes with TLS ports on a real etcd, for the replicated-move tests."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.client.cluster import ClusterClient
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.ownership import owner_of
from supervisor.cluster.replica_set import ReplicaSet, replicas_of
from supervisor.cluster.transport import Role
from tests.etcd_server import EtcdServer, free_port
from tests.support import Daemon, log_user_keys
from tests.tls_certs import Certificates
from worker.store.loader import load_session

NAMES = ("a", "b", "c", "d")


@dataclass
class Nodes:
    root: Path
    etcd: EtcdServer
    certs: Certificates
    addresses: dict[str, str]
    daemons: dict[str, Daemon] = field(default_factory=dict)
    zones: dict[str, str] = field(default_factory=dict)  # "a"'s in loopd.toml, others' flags

    def start(self, name: str, *more: str) -> Daemon:
        files = self.certs.issue(name, Role.NODE)
        args = ["--cluster", self.etcd.url, "--node", name, "--lease-ttl", "3"]
        args += ["--listen", self.addresses[name], *self.certs.args(files), *more]
        home = self.root / name
        home.mkdir(parents=True, exist_ok=True)
        zone = self.zones.get(name)
        in_file = f'zone = "{zone}"\n' if zone is not None and name == "a" else ""
        if zone is not None and name != "a":
            args += ["--zone", zone]
        (home / "loopd.toml").write_text("replicas = 3\n" + in_file)
        self.daemons[name] = Daemon(home, *args)
        return self.daemons[name]

    def kill(self, name: str) -> None:
        """SIGKILL every process of the node: its workers and its daemon."""
        daemon = self.daemons[name]
        for proc in daemon.workers():
            proc.send_signal(signal.SIGKILL)
        daemon.proc.send_signal(signal.SIGKILL)
        daemon.stop()

    def client(self) -> ClusterClient:
        return ClusterClient(self.etcd.url, timeout=20, tls=self.certs.issue("app", Role.CLIENT))

    def operator_env(self) -> dict[str, str]:
        files = self.certs.issue("ops", Role.OPERATOR)
        return {"LOOPD_TLS_CA": files.ca, "LOOPD_TLS_CERT": files.cert, "LOOPD_TLS_KEY": files.key}

    def replica_set(self) -> ReplicaSet:
        with EtcdClient(self.etcd.url) as etcd:
            current = replicas_of(etcd, "r")
        assert current is not None
        return current

    def owner(self) -> tuple[str, int]:
        with EtcdClient(self.etcd.url) as etcd:
            owner = owner_of(etcd, "r")
        assert owner is not None
        return owner.node, owner.token

    def copy_keys(self, name: str) -> list[str | None]:
        copies = self.root / name / "replicas"
        load_session(str(copies / "sessions" / "r"), "r", history=True)
        return log_user_keys(copies, "r")


class InSyncWatch:
    """Reads etcd in a thread until stopped: the fewest copies in sync it saw."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.fewest: int | None = None
        self.reads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> InSyncWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with EtcdClient(self.url) as etcd:
            while not self._stop.is_set():
                current = replicas_of(etcd, "r")
                assert current is not None
                copies = 1 + len(current.in_sync)  # the owner's copy and the followers'
                self.fewest = copies if self.fewest is None else min(self.fewest, copies)
                self.reads += 1


@contextlib.contextmanager
def running_nodes(
    root: Path, zones: dict[str, str] | None = None, serve_args: tuple[str, ...] = ()
) -> Iterator[Nodes]:
    """etcd and the four nodes (each in its zone of ``zones``, each ``loopd serve`` with
    ``serve_args`` too), all stopped after."""
    root.mkdir()
    etcd = EtcdServer(root / "etcd")
    etcd.start()
    addresses = {name: f"tls://127.0.0.1:{free_port()}" for name in NAMES}
    cluster = Nodes(root, etcd, Certificates(root / "certs"), addresses, zones=zones or {})
    try:
        for name in NAMES:
            cluster.start(name, *serve_args)
        yield cluster
    finally:
        for daemon in cluster.daemons.values():
            daemon.stop()
        etcd.stop()
