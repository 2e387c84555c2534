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
"""Run on etcd's host: wait until it answers (the test's own namespace cannot reach it)."""


def host_certificates(certs: Certificates, host: Host, name: str, role: Role | None) -> Path:
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
        raise AssertionError(f"{done.stderr.strip()}: {log}")


def start_etcd_members(hosts: list[Host], certs: Certificates) -> str:
    """One etcd member on each of ``hosts``, serving clients over https with
    ``--client-cert-auth`` (a certificate of the cluster CA required); the client URL
    naming every member."""
    peers = ",".join(f"m{n}=http://{h.address}:2380" for n, h in enumerate(hosts))
    urls = []
    for n, host in enumerate(hosts):
        copy = host_certificates(certs, host, host.address, None)
        files = private_files(host)
        url = f"https://{host.address}:{ETCD_PORT}"
        urls.append(url)
        host.spawn(
            [
                etcd_binary(), f"--name=m{n}", f"--data-dir={host.private / 'etcd'}",
                f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
                f"--listen-peer-urls=http://{host.address}:2380",
                f"--initial-advertise-peer-urls=http://{host.address}:2380",
                f"--initial-cluster={peers}", "--initial-cluster-state=new",
                f"--cert-file={files.cert}", f"--key-file={files.key}",
                f"--trusted-ca-file={files.ca}", "--client-cert-auth", "--log-level=error",
            ],
            log=host.root / "etcd.log", copy=copy,
        )  # fmt: skip
    for host, url in zip(hosts, urls, strict=True):
        wait_for_etcd(host, url, private_files(host))
    return ",".join(urls)


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
    steps: list[dict[str, object]],
    *,
    role: Role = Role.CLIENT,
    extra: Path | None = None,
) -> list[dict[str, Any]]:
    """On the client ``host``, once every node answers: ``steps`` (tests/netns_client.py)
    with a certificate of ``role`` (``extra``: a directory copied to its tmpfs too); each
    step's result."""
    copy = host_certificates(certs, host, f"{host.name}-{role.value}", role)
    files = private_files(host)
    env = f"LOOPD_TLS_CA={files.ca} LOOPD_TLS_CERT={files.cert} LOOPD_TLS_KEY={files.key}"
    plan = json.dumps({"etcd": etcd_url, "nodes": nodes, "steps": steps})
    done = host.run(
        ["env", *env.split(), *host.python("-m", "tests.netns_client", plan)],
        copy=Path(f"{copy}:{extra}") if extra else copy, timeout=110,
    )  # fmt: skip
    if done.returncode != 0:
        logs = sorted(host.root.parent.glob("*/serve.log"))
        tails = "".join(f"\n--- {log.parent.name}: " + log.read_text()[-1500:] for log in logs)
        raise AssertionError(f"the client host failed: {done.stderr.strip()[-2000:]}{tails}")
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return results


def session_keys(host: Host, node: subprocess.Popen[bytes], session: str) -> dict[str, Any]:
    """What the node's home holds of ``session``, read on its host (the home is private):
    whether the copy exists, its keys in log order, whether it opens and verifies."""
    home = host.private / "home"
    script = (
        "import json, os, sys; from pathlib import Path\n"
        "from tests.support import log_user_keys\n"
        "from worker.store.loader import load_session\n"
        f"home, s = Path({str(home)!r}), {session!r}\n"
        "d = home / 'sessions' / s\n"
        "out = {'exists': d.is_dir(), 'keys': [], 'token': None}\n"
        "if d.is_dir():\n"
        "    out['keys'] = log_user_keys(home, s)\n"
        "    out['token'] = load_session(str(d), s).fence.token\n"
        "print(json.dumps(out))\n"
    )
    done = host.inside(node, host.python("-c", script))
    if done.returncode != 0:
        raise AssertionError(f"reading {session} on {host.name} failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result
