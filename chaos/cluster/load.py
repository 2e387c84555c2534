"""The client side of ``loopd chaos cluster``: run on the client host, one JSON line each.

    python -m chaos.cluster.load setup PLAN    # wait for the cluster, create the sessions
    python -m chaos.cluster.load load PLAN     # keyed sends until SIGTERM (one process)
    python -m chaos.cluster.load final PLAN    # each session's placement and owner
    python -m chaos.cluster.load dump PLAN     # the sessions' files out of the database

PLAN is JSON: ``{"etcd": URL, "nodes": [...], "sessions": [...], "process": N, "seed": S,
"store": URI or null, "out": DIR}``;
the certificate is the host's (``$LOOPD_TLS_*``). ``load`` sends, through one
``ClusterClient``, requests each with a key of its own to sessions picked at random; a
request that fails is sent again with the same key (a fresh route each time) until it is
acknowledged, or its retry time is spent, or the run ends. Each request ends in one line:
``{"ev": "request", "outcome": "ack" | "refused" | "unknown", ...}`` with, for an ack, the
reply's token and duplicate flag and the node that answered; ``refused`` only when no
attempt was sent to a node (each failed at the owner's lookup in etcd), ``unknown``
otherwise.
Times are ``time.monotonic()`` (one clock for every namespace of the machine).
"""

from __future__ import annotations

import json
import random
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from supervisor.client.cluster import ClusterClient
from supervisor.cluster.errors import ClusterError
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.ownership import owner_of, placement_of
from supervisor.cluster.peer_link import NodeLink
from supervisor.cluster.routing import live_nodes
from supervisor.cluster.transport import TlsFiles, tls_files_from_env
from supervisor.errors import ControlError
from worker.store.disk.layout import SESSIONS_DIR

RETRY_FOR: Final = 20.0
"""How long one request is sent again after errors before its outcome is unknown."""
CALL_TIMEOUT: Final = 4.0
OWNER_WAIT: Final = 2.0
"""Seconds a request to a session nobody owns waits for its takeover (the client's
``owner_wait``: it watches the owner key), as an application riding out a failover."""
UP_DEADLINE: Final = 90.0
SENT: Final = {"now": False}
"""Whether an attempt of the request in hand reached for a node's connection: then it
may have been applied (an attempt that failed at the owner's lookup was not sent)."""
STOPPING: Final = {"now": False}
"""Set by SIGTERM: the request in hand ends, then the process."""


def emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event, sort_keys=True) + "\n")
    sys.stdout.flush()


def _files() -> TlsFiles:
    files = tls_files_from_env()
    if files is None:
        raise SystemExit("no certificate: set LOOPD_TLS_CA, LOOPD_TLS_CERT, LOOPD_TLS_KEY")
    return files


def _cluster_up(etcd: EtcdClient, nodes: list[str], files: TlsFiles) -> str | None:
    """None when every node is registered and answers a ping over TLS; else why not."""
    try:
        found = live_nodes(etcd)
    except ClusterError as exc:
        return str(exc)
    missing = [node for node in nodes if node not in found]
    if missing:
        return f"nodes not registered: {missing}"
    for node in nodes:
        link = NodeLink(found[node], node, files, timeout=2.0)
        try:
            link.call("ping")
        except ControlError as exc:
            return f"node {node}: {exc}"
        finally:
            link.close()
    return None


def wait_up(plan: dict[str, Any]) -> None:
    """Wait until every node of the plan is up, or exit with the last reason."""
    files = _files()
    deadline = time.monotonic() + UP_DEADLINE
    with EtcdClient(plan["etcd"], timeout=1.0, tls=files.etcd_context()) as etcd:
        while (why := _cluster_up(etcd, plan["nodes"], files)) is not None:
            if time.monotonic() > deadline:
                raise SystemExit(f"the cluster did not come up: {why}")
            time.sleep(0.1)


def setup(plan: dict[str, Any]) -> None:
    wait_up(plan)
    with ClusterClient(plan["etcd"], timeout=CALL_TIMEOUT * 5) as cluster:
        for session in plan["sessions"]:
            cluster.create(session)
    emit({"ev": "setup", "sessions": plan["sessions"]})


def _stop(_signum: int, _frame: object) -> None:
    STOPPING["now"] = True


def one_request(cluster: ClusterClient, process: int, session: str, key: str) -> dict[str, Any]:
    """Send one keyed request until acknowledged, or its retry time is spent."""
    start = time.monotonic()
    errors: list[str] = []
    SENT["now"] = SENT.get("always", False)
    attempts = 0
    while True:
        attempts += 1
        try:
            reply = cluster.send(session, f"chaos {key}", key=key)
        except (ClusterError, ControlError, OSError) as exc:  # StaleOwner: a reply refused
            errors.append(f"{type(exc).__name__}: {exc}")
        else:
            route = getattr(cluster, "_routes", {}).get(session)  # the node that answered
            return {"ev": "request", "outcome": "ack", "p": process, "s": session, "k": key,
                    "token": reply.get("token"), "duplicate": bool(reply.get("duplicate")),
                    "node": route.node if route else None, "t0": start,
                    "t1": time.monotonic(), "attempts": attempts,
                    "errors": errors[-3:]}  # fmt: skip
        if STOPPING["now"] or time.monotonic() - start > RETRY_FOR:
            outcome = "unknown" if SENT["now"] else "refused"
            return {"ev": "request", "outcome": outcome, "p": process, "s": session, "k": key,
                    "token": None, "duplicate": False, "node": None, "t0": start,
                    "t1": time.monotonic(), "attempts": attempts,
                    "errors": errors[-3:]}  # fmt: skip
        time.sleep(0.2)


def _noting(step: Callable[..., Any]) -> Callable[..., Any]:
    """``step`` that first notes that what follows may send the request (then a failed
    request's outcome is unknown, never refused)."""

    def noted(*args: Any) -> Any:
        SENT["now"] = True
        return step(*args)

    return noted


def load(plan: dict[str, Any]) -> None:
    signal.signal(signal.SIGTERM, _stop)
    process = int(plan["process"])
    rng = random.Random(plan["seed"] * 1000 + process)
    with ClusterClient(plan["etcd"], timeout=CALL_TIMEOUT, owner_wait=OWNER_WAIT) as cluster:
        # The client's own steps that lead to sending (private: kept in step with
        # supervisor/client/cluster.py: `_link` for a control call, `_direct` for a send
        # over TCP, `_client` for a send to a unix: node); without them every failed
        # request is unknown (never refused: the safe side).
        wanted = ("_link", "_direct", "_client")
        steps = [name for name in wanted if callable(getattr(cluster, name, None))]
        if len(steps) != len(wanted):
            SENT["always"] = True
        for name in steps:
            setattr(cluster, name, _noting(getattr(cluster, name)))
        n = 0
        while not STOPPING["now"]:
            session = rng.choice(plan["sessions"])
            emit(one_request(cluster, process, session, f"p{process}-{n}"))
            n += 1
    emit({"ev": "end", "p": process, "requests": n})


def final(plan: dict[str, Any]) -> None:
    """Each session's placement and owner as etcd holds them, once the nodes are up."""
    wait_up(plan)
    files = _files()
    with EtcdClient(plan["etcd"], timeout=2.0, tls=files.etcd_context()) as etcd:
        placed = {s: placement_of(etcd, s) for s in plan["sessions"]}
        owners = {}
        for session in plan["sessions"]:
            owner = owner_of(etcd, session)
            owners[session] = None if owner is None else [owner.node, owner.token]
    emit({"ev": "final", "placement": placed, "owners": owners})


def dump(plan: dict[str, Any]) -> None:
    """Each session's files as one snapshot of the database holds them, written as a home
    holds them (``<out>/home/sessions/<id>/``), for the checker and ``loopd verify``."""
    from worker.store.errors import SessionNotFound  # noqa: PLC0415 - the driver, here only
    from worker.store.postgres.store import PostgresStore  # noqa: PLC0415
    from worker.store.postgres.transfer import session_files  # noqa: PLC0415

    store = PostgresStore(plan["store"])
    home = Path(plan["out"]) / "home"
    found = []
    for session in plan["sessions"]:
        try:
            files = session_files(store, session)
        except SessionNotFound:
            continue
        for name, data in files.items():
            path = home / SESSIONS_DIR / session / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        found.append(session)
    emit({"ev": "dump", "sessions": found})


def main() -> None:
    modes = {"setup": setup, "load": load, "final": final, "dump": dump}
    if len(sys.argv) != 3 or sys.argv[1] not in modes:
        raise SystemExit("usage: python -m chaos.cluster.load setup|load|final|dump PLAN")
    modes[sys.argv[1]](json.loads(sys.argv[2]))


if __name__ == "__main__":
    main()
