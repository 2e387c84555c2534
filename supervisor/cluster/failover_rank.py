"""Which in-sync follower takes a session over: the one whose copy is furthest.

Every acknowledged write is on every in-sync follower, so any of them may take over
safely; but one may hold more than another (a step the owner shipped to it and died
before the others acknowledged). The furthest loses the least unacknowledged work, and
the others need no rewind of it: a follower that finds another in-sync follower's copy
ending further than its own (asked over the transport, ``replica_position``) leaves the
takeover to it for ``DEFER_FOR`` seconds, then takes over itself if nobody did (the
further one may have no working etcd link). A follower that does not answer within
``ASK_TIMEOUT`` counts as not further.
"""

from __future__ import annotations

import os
from typing import Final

from supervisor.cluster.follower_link import FollowerLink
from supervisor.cluster.replica_set import ReplicaSet
from supervisor.cluster.transport import TlsFiles
from worker.catch_up import ShipFailed
from worker.store.epoch_files import list_epochs
from worker.store.errors import SessionError
from worker.store.layout import session_dir
from worker.store.replica_roles import replicas_root
from worker.store.session_state import log_path

ASK_TIMEOUT: Final = 0.5
DEFER_FOR: Final = 1.0


def copy_end(home: str, session: str) -> tuple[int, int]:
    """(epoch, bytes) where this node's follower copy of ``session`` ends; (-1, 0): none."""
    directory = session_dir(replicas_root(home), session)
    try:
        epoch = list_epochs(directory)[-1]
        return epoch, os.stat(log_path(directory, epoch)).st_size
    except (SessionError, OSError, IndexError):
        return -1, 0


def further_follower(
    current: ReplicaSet, me: str, session: str, mine: tuple[int, int], files: TlsFiles | None
) -> str | None:
    """An in-sync follower other than ``me`` whose copy ends further than ``mine``, or None
    (none does, or none could be asked: no address known, no certificate, no answer)."""
    if files is None:
        return None
    addresses = dict(current.addresses)
    for node in current.in_sync:
        address = addresses.get(node)
        if node == me or address is None:
            continue
        link = FollowerLink(node, address, files, timeout=ASK_TIMEOUT)
        try:
            position = link.position(session)
        except ShipFailed:
            continue
        finally:
            link.close()
        if position is not None and (position.epoch, position.size) > mine:
            return node
    return None
