"""``python -m tests.replica_mover URL SESSION TARGET [STEP]``: a replicated move that
SIGKILLs itself just before STEP (a ReplicaStep value), with the operator certificate
named by LOOPD_TLS_CA, LOOPD_TLS_CERT and LOOPD_TLS_KEY."""

from __future__ import annotations

import os
import signal
import sys

from supervisor.cli.cluster_commands import RemoteNodes
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.replica_move import ReplicaStep, move_replicated
from supervisor.cluster.transport import tls_files_from_env


def main(argv: list[str]) -> int:
    url, session, target = argv[:3]
    kill_at = ReplicaStep(argv[3]) if len(argv) > 3 else None

    def hook(step: ReplicaStep) -> None:
        if step is kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    files = tls_files_from_env()
    assert files is not None
    with EtcdClient(url) as client:
        calls = RemoteNodes(client, files)
        try:
            move_replicated(client, session, target, calls, before_step=hook)
        finally:
            calls.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
