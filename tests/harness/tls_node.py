"""A node serving ``--listen tls://`` on loopback with an etcd of its own, for the TLS tests.

``start_node`` yields the node (its daemon, its certificates, a client's TLS files) and
stops the daemon and etcd after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from supervisor.client.cluster import ClusterClient
from supervisor.cluster.transport import Role, TlsFiles
from supervisor.hosting.session_log import log_path
from tests.harness.etcd_server import EtcdServer, free_port
from tests.harness.support import Daemon
from tests.harness.tls_certs import Certificates


@dataclass
class Node:
    etcd: EtcdServer
    certs: Certificates
    daemon: Daemon
    address: str
    client: TlsFiles

    @property
    def home(self) -> Path:
        return self.daemon.home

    def cluster(self, files: TlsFiles | None = None, timeout: float = 20) -> ClusterClient:
        return ClusterClient(self.etcd.url, timeout=timeout, tls=files or self.client)

    def worker_log(self, session: str) -> str:
        path = Path(log_path(str(self.home), session))
        return path.read_text(errors="replace") if path.exists() else ""

    def worker_refusals(self, session: str) -> list[str]:
        return [x for x in self.worker_log(session).splitlines() if "tls: refused" in x]


def start_node(tmp_path: Path, *more: str) -> Iterator[Node]:
    root = tmp_path / "tls"
    certs = Certificates(root / "certs")
    etcd = EtcdServer(root / "etcd")
    etcd.start()
    try:
        address = f"tls://127.0.0.1:{free_port()}"
        node_files = certs.issue("a", Role.NODE)
        args = ["--cluster", etcd.url, "--node", "a", "--listen", address, *more]
        daemon = Daemon(root / "a", *args, *certs.args(node_files))
        try:
            yield Node(etcd, certs, daemon, address, certs.issue("app", Role.CLIENT))
        finally:
            daemon.stop()
    finally:
        etcd.stop()
