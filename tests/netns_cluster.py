"""A cluster on the hosts of ``tests/netns_hosts.py``: etcd, nodes and clients, each a host."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any, Final

from supervisor.cluster.transport import Role, TlsFiles
from tests.etcd_server import etcd_binary
from tests.netns_hosts import Host
from tests.tls_certs import Certificates

ETCD_PORT: Final = 2379
NODE_PORT: Final = 7443


def host_certificates(certs: Certificates, host: Host, name: str, role: Role) -> Path:
    """A directory holding the CA and ``name``'s certificate of ``role``, to copy into the
    host's private tmpfs (where it is ``<private>/certs``)."""
    issued = certs.issue(name, role)
    folder = host.root / "certs"
    folder.mkdir(parents=True, exist_ok=True)
    for source, target in (
        (issued.ca, "ca.pem"),
        (issued.cert, "cert.pem"),
        (issued.key, "key.pem"),
    ):
        shutil.copyfile(source, folder / target)
    return folder


def private_files(host: Host) -> TlsFiles:
    """The host's certificate files as its own processes see them."""
    base = host.private / "certs"
    return TlsFiles(ca=str(base / "ca.pem"), cert=str(base / "cert.pem"), key=str(base / "key.pem"))


def tls_args(files: TlsFiles) -> list[str]:
    return ["--tls-ca", files.ca, "--tls-cert", files.cert, "--tls-key", files.key]


def start_etcd(host: Host) -> str:
    """One etcd member on ``host`` (data in its private tmpfs); its client URL."""
    url = f"http://{host.address}:{ETCD_PORT}"
    peer = f"http://{host.address}:2380"
    host.spawn(
        [
            etcd_binary(),
            "--name=h",
            f"--data-dir={host.private / 'etcd'}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=h={peer}",
            "--log-level=error",
        ],
        log=host.root / "etcd.log",
    )
    return url


def node_address(host: Host) -> str:
    return f"tls://{host.address}:{NODE_PORT}"


def start_node(
    host: Host, name: str, etcd_url: str, certs: Certificates
) -> subprocess.Popen[bytes]:
    """``loopd serve`` as node ``name`` on ``host``: home and certificates in its tmpfs."""
    copy = host_certificates(certs, host, name, Role.NODE)
    return host.spawn(
        host.python(
            "-m",
            "supervisor",
            "serve",
            "--home",
            str(host.private / "home"),
            "--cluster",
            etcd_url,
            "--node",
            name,
            "--lease-ttl",
            "3",
            "--listen",
            node_address(host),
            *tls_args(private_files(host)),
        ),
        log=host.root / "serve.log",
        copy=copy,
    )


def run_client(
    host: Host,
    certs: Certificates,
    etcd_url: str,
    nodes: list[str],
    commands: list[list[str]],
    *,
    role: Role = Role.CLIENT,
    sessions: list[str] | None = None,
) -> dict[str, Any]:
    """On the client ``host``, once every node answers: ``sessions`` created and sent to
    through ClusterClient, then ``commands`` (loopd's argv); what tests/netns_client.py
    prints."""
    copy = host_certificates(certs, host, f"{host.name}-user", role)
    files = private_files(host)
    env = f"LOOPD_TLS_CA={files.ca} LOOPD_TLS_CERT={files.cert} LOOPD_TLS_KEY={files.key}"
    plan = json.dumps(
        {"etcd": etcd_url, "nodes": nodes, "commands": commands, "sessions": sessions or []}
    )
    done = host.run(
        ["env", *env.split(), *host.python("-m", "tests.netns_client", plan)],
        copy=copy,
        timeout=110,
    )
    if done.returncode != 0:
        raise AssertionError(f"the client host failed: {done.stderr.strip()[-2000:]}")
    results: dict[str, Any] = json.loads(done.stdout)
    return results
