"""A cluster on the hosts of ``chaos/cluster/netns_hosts.py``: etcd and nodes, each a host.

Used by ``loopd chaos cluster`` and, through ``tests/harness/netns_cluster.py``, by the cluster
tests. Certificates come from an ``Issuer``: the tests' ``trustme`` CA, or the
``openssl`` one of ``chaos/cluster/certs.py``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Final, Protocol

from chaos.cluster.netns_hosts import HarnessError, Host
from supervisor.cluster.transport import Role, TlsFiles

ETCD_PORT: Final = 2379
NODE_PORT: Final = 7443
LEASE_TTL: Final = 3
_WAIT_FOR_ETCD: Final = """
import sys, time
from supervisor.cluster.errors import ClusterError
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.transport import TlsFiles
files = TlsFiles(*{files!r}) if {files!r} else None
deadline = time.monotonic() + 40
with EtcdClient({url!r}, timeout=0.5, tls=files and files.etcd_context()) as etcd:
    while True:
        try:
            etcd.range("/health-check")
            break
        except ClusterError as exc:
            if time.monotonic() > deadline:
                sys.exit(f"etcd did not start: {{exc}}")
            time.sleep(0.02)
"""
"""Run on etcd's host: wait until it answers (the machine's own namespace cannot reach it)."""


class Issuer(Protocol):
    """What issues the cluster's certificates: a CA and a leaf per name and role."""

    def issue(self, name: str, role: Role | None) -> TlsFiles: ...


def host_certificates(certs: Issuer, host: Host, name: str, role: Role | None) -> Path:
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


def tls_env(files: TlsFiles) -> list[str]:
    """``env`` arguments naming ``files`` to every loopd client command."""
    return [f"LOOPD_TLS_CA={files.ca}", f"LOOPD_TLS_CERT={files.cert}",
            f"LOOPD_TLS_KEY={files.key}"]  # fmt: skip


def data_dir(host: Host, what: str) -> Path:
    """Where ``what`` (a home, etcd's data) lives on ``host``: on its disk if it has one."""
    return host.private / ("disk" if host.disk is not None else "") / what


def start_etcd(host: Host, binary: str) -> str:
    """One etcd member on ``host`` (data in its private tmpfs or disk); its client URL."""
    url = f"http://{host.address}:{ETCD_PORT}"
    peer = f"http://{host.address}:2380"
    host.spawn(
        [
            binary,
            "--name=h",
            f"--data-dir={data_dir(host, 'etcd')}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=h={peer}",
            "--log-level=error",
        ],
        log=host.root / "etcd.log",
    )
    wait_for_etcd(host, url)
    return url


def wait_for_etcd(host: Host, url: str, files: TlsFiles | None = None) -> None:
    """Wait, on ``host``, until etcd at ``url`` answers (``files``: as the host sees them)."""
    given = (files.ca, files.cert, files.key) if files else None
    script = _WAIT_FOR_ETCD.format(url=url, files=given)
    copy = host.root / "certs" if files else None
    done = host.run(host.python("-c", script), timeout=60, copy=copy)
    if done.returncode != 0:
        log = (host.root / "etcd.log").read_text(errors="replace")[-2000:]
        raise HarnessError(f"{done.stderr.strip()}: {log}")


def etcd_member_argv(hosts: list[Host], n: int, binary: str) -> list[str]:
    """The command of etcd member ``n`` of ``hosts`` (https for clients, client
    certificates required); the same command starts it again on its data."""
    host = hosts[n]
    peers = ",".join(f"m{k}=http://{h.address}:2380" for k, h in enumerate(hosts))
    files = private_files(host)
    url = f"https://{host.address}:{ETCD_PORT}"
    return [
        binary, f"--name=m{n}", f"--data-dir={data_dir(host, 'etcd')}",
        f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
        f"--listen-peer-urls=http://{host.address}:2380",
        f"--initial-advertise-peer-urls=http://{host.address}:2380",
        f"--initial-cluster={peers}", "--initial-cluster-state=new",
        f"--cert-file={files.cert}", f"--key-file={files.key}",
        f"--trusted-ca-file={files.ca}", "--client-cert-auth", "--log-level=error",
    ]  # fmt: skip


def start_etcd_member(hosts: list[Host], n: int, binary: str) -> subprocess.Popen[bytes]:
    """Start member ``n`` (its certificates issued already, ``start_etcd_members``)."""
    host = hosts[n]
    argv = etcd_member_argv(hosts, n, binary)
    return host.spawn(argv, log=host.root / "etcd.log", copy=host.root / "certs")


def start_etcd_members(hosts: list[Host], certs: Issuer, binary: str) -> str:
    """One etcd member on each of ``hosts``, serving clients over https with
    ``--client-cert-auth`` (a certificate of the cluster CA required); the client URL
    naming every member."""
    for n, host in enumerate(hosts):
        host_certificates(certs, host, host.address, None)
        start_etcd_member(hosts, n, binary)
    urls = [f"https://{host.address}:{ETCD_PORT}" for host in hosts]
    for host, url in zip(hosts, urls, strict=True):
        wait_for_etcd(host, url, private_files(host))
    return ",".join(urls)


def node_address(host: Host) -> str:
    return f"tls://{host.address}:{NODE_PORT}"


def start_node(
    host: Host,
    name: str,
    etcd_url: str,
    certs: Issuer | None,
    *,
    lease_ttl: float = LEASE_TTL,
    extra: tuple[str, ...] = (),
) -> subprocess.Popen[bytes]:
    """``loopd serve`` as node ``name`` on ``host``: home and certificates in its tmpfs
    (or the home on its disk); ``certs`` None: the certificates issued before, again;
    ``extra``: more of serve's options (``--store URI``)."""
    copy = host.root / "certs" if certs is None else host_certificates(certs, host, name,
                                                                       Role.NODE)  # fmt: skip
    return host.spawn(
        host.python(
            "-m",
            "supervisor",
            "serve",
            "--home",
            str(data_dir(host, "home")),
            "--cluster",
            etcd_url,
            "--node",
            name,
            "--lease-ttl",
            f"{lease_ttl:g}",
            "--listen",
            node_address(host),
            *tls_args(private_files(host)),
            *extra,
        ),
        log=host.root / "serve.log",
        copy=copy,
    )
