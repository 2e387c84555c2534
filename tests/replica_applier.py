"""A process that catches a follower's copy up with an owner's log, one group per step.

``python -m tests.replica_applier OWNER_HOME ROOT SESSION``: opens (or creates) the copy
in ROOT, then applies every step after its position, each group alone, and exits 0
when the copy holds the owner's whole log. The tests SIGKILL it anywhere on the way.
"""

from __future__ import annotations

import sys

from worker.store.errors import SessionNotFound
from worker.store.replica import Replica
from worker.store.replica_source import split_step, steps_after
from worker.store.session_state import log_path


def main(owner_home: str, root: str, session_id: str) -> int:
    try:
        replica: Replica | None = Replica.open(root, session_id)
    except SessionNotFound:  # no copy yet (or a create cut short): the first step makes it
        replica = None
    while True:
        position = replica.position if replica is not None else None
        steps = steps_after(owner_home, session_id, position, 1)
        if not steps:
            break
        for step in steps:
            for piece in split_step(step, 1):
                if replica is None:
                    replica = Replica.create(root, piece)
                else:
                    replica.apply(piece)
    assert replica is not None
    print(log_path(replica.dir, replica.position.epoch), flush=True)
    replica.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
