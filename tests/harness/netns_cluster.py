"""A cluster on the hosts of ``tests/harness/netns_hosts.py``: etcd, nodes and clients, each a host.

etcd and the nodes are started by ``chaos/cluster/netns_cluster.py`` (which ``loopd chaos
cluster`` uses too), with the etcd binary of ``tests/harness/etcd_server.py``; here the client
host's steps (``tests/programs/netns_client.py``) and what a node's home holds.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from chaos.cluster import netns_cluster as _cluster
from chaos.cluster.netns_cluster import (
    ETCD_PORT,
    NODE_PORT,
    host_certificates,
    node_address,
    private_files,
    tls_args,
    wait_for_etcd,
)
from supervisor.cluster.transport import Role
from tests.harness.etcd_server import etcd_binary
from tests.harness.netns_hosts import Host
from tests.harness.tls_certs import Certificates

__all__ = [
    "ETCD_PORT",
    "NODE_PORT",
    "host_certificates",
    "node_address",
    "private_files",
    "run_client",
    "session_keys",
    "start_etcd",
    "start_etcd_members",
    "start_node",
    "tls_args",
    "wait_for_etcd",
]


def start_etcd(host: Host) -> str:
    """One etcd member on ``host`` (data in its private tmpfs); its client URL."""
    return _cluster.start_etcd(host, etcd_binary())


def start_etcd_members(hosts: list[Host], certs: Certificates) -> str:
    """One etcd member on each of ``hosts``, https with client certificates; the URL."""
    return _cluster.start_etcd_members(hosts, certs, etcd_binary())


def start_node(
    host: Host, name: str, etcd_url: str, certs: Certificates
) -> subprocess.Popen[bytes]:
    """``loopd serve`` as node ``name`` on ``host``: home and certificates in its tmpfs."""
    return _cluster.start_node(host, name, etcd_url, certs)


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
    """On the client ``host``, once every node answers: ``steps`` (tests/programs/netns_client.py)
    with a certificate of ``role`` (``extra``: a directory copied to its tmpfs too); each
    step's result."""
    copy = host_certificates(certs, host, f"{host.name}-{role.value}", role)
    files = private_files(host)
    env = f"LOOPD_TLS_CA={files.ca} LOOPD_TLS_CERT={files.cert} LOOPD_TLS_KEY={files.key}"
    plan = json.dumps({"etcd": etcd_url, "nodes": nodes, "steps": steps})
    done = host.run(
        ["env", *env.split(), *host.python("-m", "tests.programs.netns_client", plan)],
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
        "from tests.harness.support import log_user_keys\n"
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
