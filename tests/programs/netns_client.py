"""A client host's script for the namespace tests: wait for the cluster, then run steps.

    python -m tests.programs.netns_client '{"etcd": URL, "nodes": [...], "steps": [...]}'

Waits (against a deadline) until etcd answers, every named node is registered and each
answers ``ping`` over TLS with this host's certificate ($LOOPD_TLS_*); then runs each
step in order, through one ``ClusterClient``: ``{"create": ID}``, ``{"send": ID, "key":
K}``, ``{"interrupt": ID, "to": NODE, "before": STEP}`` (a move stopped before STEP),
or ``{"loopd": [argv...]}`` (``loopd ...`` as ``python -m supervisor ...``).
Prints one JSON list, a result per step: ``{"ok": reply}`` or ``{"error": "..."}``, and
for a command its exit code, stdout and stderr.
"""

from __future__ import annotations

import json
import subprocess
import sys

from supervisor.cli.cluster_commands import RemoteNodes
from supervisor.client.cluster import ClusterClient
from supervisor.cluster.errors import ClusterError
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.ownership import owner_of
from supervisor.cluster.peer_link import NodeLink
from supervisor.cluster.routing import live_nodes
from supervisor.cluster.transport import tls_files_from_env
from supervisor.errors import ControlError
from supervisor.moves.move import MoveStep
from supervisor.moves.remote_move import move_remote
from tests.harness.support import poll_until

DEADLINE = 60.0


def wait_for(url: str, nodes: list[str]) -> None:
    files = tls_files_from_env()
    last = ["nothing tried"]
    context = files.etcd_context() if files is not None else None
    with EtcdClient(url, timeout=1.0, tls=context) as etcd:

        def up() -> bool:
            """etcd answers, every node is registered, and each answers a ping over TLS."""
            try:
                found = live_nodes(etcd)
            except ClusterError as exc:
                last[0] = str(exc)
                return False
            missing = [node for node in nodes if node not in found]
            if missing or files is None:
                last[0] = f"nodes not registered: {missing}"
                return False
            try:
                for node in nodes:
                    link = NodeLink(found[node], node, files, timeout=2.0)
                    try:
                        link.call("ping")
                    finally:
                        link.close()
            except ControlError as exc:
                last[0] = str(exc)
                return False
            return True

        try:
            poll_until(up, timeout=DEADLINE, what="the cluster")
        except AssertionError:
            raise SystemExit(f"the cluster did not come up: {last[0]}") from None


def run_step(cluster: ClusterClient, step: dict[str, object]) -> dict[str, object]:
    if "loopd" in step:
        argv = [str(arg) for arg in step["loopd"]]  # type: ignore[attr-defined]
        done = subprocess.run(
            [sys.executable, "-m", "supervisor", *argv],
            check=False, capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        return {"argv": argv, "code": done.returncode, "stdout": done.stdout,
                "stderr": done.stderr}  # fmt: skip
    if "interrupt" in step:
        return interrupted_move(cluster, step)
    if "wait_unowned" in step:  # a dead node's lease expiring
        session = str(step["wait_unowned"])
        try:
            poll_until(lambda: owner_of(cluster.etcd, session) is None, timeout=30, what=session)
        except AssertionError:
            return {"error": "still owned"}
        return {"ok": "unowned"}
    try:
        if "create" in step:
            return {"ok": cluster.create(str(step["create"]))}
        return {"ok": cluster.send(str(step["send"]), "hello", key=str(step["key"]))}
    except (ClusterError, ControlError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


class Interrupted(Exception):
    """The mover stops here, as if it were killed before this step."""


def interrupted_move(cluster: ClusterClient, step: dict[str, object]) -> dict[str, object]:
    """``{"interrupt": ID, "to": NODE, "before": STEP}``: a move between hosts that stops
    before STEP, leaving etcd and the disks as a mover killed there would."""
    files = tls_files_from_env()
    assert files is not None
    calls = RemoteNodes(cluster.etcd, files)

    def hook(reached: MoveStep) -> None:
        if reached.value == step["before"]:
            raise Interrupted(reached.value)

    try:
        move_remote(cluster.etcd, str(step["interrupt"]), str(step["to"]), calls,
                    before_step=hook)  # fmt: skip
    except Interrupted as exc:
        return {"ok": {"stopped_before": str(exc)}}
    except (ClusterError, ControlError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        calls.close()
    return {"error": "the move was not interrupted"}


def main() -> None:
    plan = json.loads(sys.argv[1])
    wait_for(plan["etcd"], plan["nodes"])
    with ClusterClient(plan["etcd"], timeout=20) as cluster:
        print(json.dumps([run_step(cluster, step) for step in plan["steps"]]))


if __name__ == "__main__":
    main()
