"""A returning old owner: its copy of a replicated session becomes a follower's.

A node that starts again (or renews a lost lease) and finds a session on its disk that
another node now owns looked only at the placement before: it quarantined the whole
copy, and the new owner caught it up from nothing, a whole copy shipped again while no
other follower might be in sync. When the session is replicated and etcd names this
node one of its followers (the takeover put the old owner there), the copy is demoted
instead (``worker.store.replica_roles.demote``): moved whole to
``<home>/replicas/sessions/<id>``, a torn last group quarantined first. The new owner's
catch-up then finds the prefix the two logs share from the copy's line ends, cuts the
unacknowledged suffix the old owner wrote past it to ``<home>/replicas/quarantine/<id>/``
(never deleted) and ships only what follows.
"""

from __future__ import annotations

from supervisor.cluster.errors import ClusterError
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.replica_receiver import receiver_for
from supervisor.cluster.replica_set import replicas_of
from worker.store.errors import SessionError
from worker.store.replica_roles import demote


def rejoin_as_follower(client: EtcdClient, home: str, node: str, session: str) -> str | None:
    """Demote this node's copy of ``session`` to a follower's; what was done (one line),
    or None when it cannot be (not replicated, this node not a follower of it, its copy
    does not open, a follower's copy already here): the caller quarantines it whole."""
    try:
        current = replicas_of(client, session)
    except ClusterError:
        return None
    if current is None or node not in current.followers:
        return None
    try:
        moved = demote(home, session)
    except SessionError:
        return None
    receiver_for(home).resume(session)  # promoted here before, in this process
    torn = f"; its torn last group to {moved[0]}" if moved else ""
    return f"kept as a follower's copy, caught up by the owner from its last shared line{torn}"
