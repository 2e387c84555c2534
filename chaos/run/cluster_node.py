"""A cluster node as the rig plays it: one lease file, a fencing token that grows.

Every worker of the ``cluster`` scenario starts as a cluster node starts it (docs/
scaling.md): with the node's name, a token above every token in the log (the session
was acquired again: a token change at every start), the lease it was given under and
the lease file, which the rig writes with that lease proven for an hour. The fault
``lease`` (chaos.faults.hook) makes that file say nothing is proven at one boundary.
"""

from __future__ import annotations

import json
import os
import time
from typing import Final

from chaos.faults import hook
from chaos.oracle.oracle import log_files
from worker.ipc.lease_deadline import write_deadline

NODE: Final = "node-a"
PROVEN_FOR_S: Final = 3600.0


def lease_path(home: str) -> str:
    """The node's lease file: beside the home (so the home holds only sessions)."""
    return os.path.join(os.path.dirname(os.path.abspath(home)), "cluster.lease")


def fencing_records(home: str) -> list[tuple[int, int, dict[str, object]]]:
    """Every Owner and Handoff in the logs, read raw: (epoch, line, record), in order."""
    found = []
    for path in log_files(home):
        epoch = int(os.path.basename(path)[: -len(".jsonl")])
        with open(path, "rb") as f:
            for line_no, line in enumerate(f.read().split(b"\n")[:-1], start=1):
                if b'"Owner"' not in line and b'"Handoff"' not in line:
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and record.get("type") in ("Owner", "Handoff"):
                    found.append((epoch, line_no, record))
    return found


def newest_token(home: str) -> int:
    tokens = [r.get("token") for _e, _l, r in fencing_records(home)]
    return max((t for t in tokens if type(t) is int), default=0)


def publish_lease(home: str, lease: int, *, proven: bool = True) -> str:
    """Write the node's lease file: ``lease`` proven for an hour (or not at all)."""
    path = lease_path(home)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        write_deadline(fd, time.monotonic() + PROVEN_FOR_S if proven else 0.0, path, lease)
    finally:
        os.close(fd)
    return path


def node_argv(home: str, *, node: str = NODE, token: int | None = None) -> list[str]:
    """In a worker's child: a fresh lease and a token above the log's; the worker's flags."""
    token = newest_token(home) + 1 if token is None else token
    path = publish_lease(home, token)  # the lease id is the token it was given under
    hook.lease_file = path
    return ["--cluster-node", node, "--cluster-token", str(token),
            "--cluster-lease", str(token), "--lease-file", path]  # fmt: skip
