"""``python -m tests.programs.cluster_mover URL SESSION TARGET [STEP]``: a move killing itself.

With STEP (a MoveStep value) the process kills itself with SIGKILL just before that
step: the kill a mover suffers from an operator, an OOM killer or a lost host.
"""

from __future__ import annotations

import os
import signal
import sys

from supervisor.cluster.etcd import EtcdClient
from supervisor.moves.move import MoveStep, move_session


def main(argv: list[str]) -> int:
    url, session, target = argv[:3]
    kill_at = MoveStep(argv[3]) if len(argv) > 3 else None

    def hook(step: MoveStep) -> None:
        if step is kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    with EtcdClient(url) as client:
        move_session(client, session, target, before_step=hook)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
