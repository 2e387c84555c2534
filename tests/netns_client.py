"""A client host's script for the namespace tests: wait for the cluster, run commands.

    python -m tests.netns_client '{"etcd": URL, "nodes": [...], "commands": [[...], ...],
                                   "sessions": [...]}'

Waits (against a deadline) until etcd answers, every named node is registered and each
answers ``ping`` over TLS with this host's certificate ($LOOPD_TLS_*); then creates each
of ``sessions`` through ``ClusterClient`` and sends it one keyed request twice; then runs
each command (``loopd ...`` as ``python -m supervisor ...``). Prints one JSON object:
``api`` (each session's two replies, or the error), ``commands`` (each command's argv,
exit code, stdout and stderr).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from supervisor.client.cluster import ClusterClient
from supervisor.client.tls_link import NodeLink
from supervisor.cluster.errors import ClusterError
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.routing import live_nodes
from supervisor.cluster.transport import tls_files_from_env
from supervisor.errors import ControlError

DEADLINE = 40.0


def wait_for(url: str, nodes: list[str]) -> None:
    files = tls_files_from_env()
    deadline = time.monotonic() + DEADLINE
    last = "nothing tried"
    with EtcdClient(url, timeout=1.0) as etcd:
        while time.monotonic() < deadline:
            try:
                found = live_nodes(etcd)
            except ClusterError as exc:
                last = str(exc)
                time.sleep(0.05)
                continue
            missing = [node for node in nodes if node not in found]
            if missing or files is None:
                last = f"nodes not registered: {missing}"
                time.sleep(0.05)
                continue
            try:
                for node in nodes:
                    link = NodeLink(found[node], node, files, timeout=2.0)
                    try:
                        link.call("ping")
                    finally:
                        link.close()
            except ControlError as exc:
                last = str(exc)
                time.sleep(0.05)
                continue
            return
    raise SystemExit(f"the cluster did not come up: {last}")


def main() -> None:
    plan = json.loads(sys.argv[1])
    wait_for(plan["etcd"], plan["nodes"])
    api: dict[str, object] = {}
    with ClusterClient(plan["etcd"], timeout=20) as cluster:
        for session in plan.get("sessions", []):
            try:
                cluster.create(session)
                api[session] = [cluster.send(session, "hello", key=f"{session}-k") for _ in "12"]
            except (ClusterError, ControlError) as exc:
                api[session] = f"{type(exc).__name__}: {exc}"
    results = []
    for argv in plan["commands"]:
        done = subprocess.run(
            [sys.executable, "-m", "supervisor", *argv],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        results.append(
            {"argv": argv, "code": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
        )
    print(json.dumps({"api": api, "commands": results}))


if __name__ == "__main__":
    main()
