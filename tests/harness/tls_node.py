"""A node serving ``--listen tls://`` on loopback with an etcd of its own, for the TLS tests.

``start_node`` yields the node (its daemon, its certificates, a client's TLS files) and
stops the daemon and etcd after it.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from supervisor.client.cluster import ClusterClient
from supervisor.cluster.transport import Role, TlsFiles, direct_preamble
from supervisor.hosting.session_log import log_path
from tests.harness.etcd_server import EtcdServer, free_port
from tests.harness.support import Daemon
from tests.harness.tls_certs import Certificates
from worker.ipc.wire import FrameReader


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

    def node_refusals(self) -> list[str]:
        """The ``tls: refused`` lines of the node's TLS thread (the daemon's log)."""
        text = self.daemon.log_path.read_text(errors="replace")
        return [x for x in text.splitlines() if "tls: refused" in x]

    def past_the_check(self, session: str) -> socket.socket:
        """A connection the node's TLS thread checked and let through (the preamble, its
        handshake, its ok, both close_notify): plain TCP again, the worker's to serve."""
        host, port = self.address.removeprefix("tls://").split(":")
        raw = socket.create_connection((host, int(port)), timeout=10)
        raw.sendall(direct_preamble(session))
        gate = self.client.client_context().wrap_socket(raw, server_hostname="a")
        reader = FrameReader()
        while not (replies := reader.feed(data := gate.recv(1 << 16))):
            assert data, "the node closed the connection without its answer"
        assert replies[0].get("ok") is True, replies
        return gate.unwrap()


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
