"""A replicated move's steps as the nodes make them (docs/scaling.md 9.5).

Each node checks etcd before it acts, never the mover's word: the old owner demotes
its copy into ``replicas/`` only once etcd names another node the owner and this node
one of its followers (``demote_here``); the new owner promotes its follower's copy only
once etcd names it the owner (``promote_here``).
"""

from __future__ import annotations

import os
import time
import zlib

from supervisor.cluster.errors import MoveFailed
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.ownership import owner_of
from supervisor.cluster.replica_receiver import receiver_for
from supervisor.cluster.replica_set import replicas_of
from supervisor.cluster.session_files import QUARANTINE_DIR, set_aside
from worker.store.errors import SessionError
from worker.store.layout import SESSIONS_DIR, session_dir
from worker.store.loader import load_session
from worker.store.replica_roles import demote, promote, replicas_root
from worker.store.replica_types import Position
from worker.store.session_state import log_path


def demote_here(client: EtcdClient, node: str, home: str, session: str) -> dict[str, object]:
    """The old owner's step: its whole copy becomes a follower's copy in ``replicas/``.

    Its log is kept whole (every acknowledged write is in it); a suffix its worker wrote
    and never had acknowledged is cut back by the new owner's catch-up, to quarantine.
    If a follower's copy is already there (the new owner's worker made one from nothing
    first) this node's own copy is set aside in ``quarantine/`` instead, never deleted.
    """
    owner = owner_of(client, session)
    current = replicas_of(client, session)
    if owner is None or owner.node == node:
        raise MoveFailed(session, "demote", f"etcd names {owner.node if owner else 'nobody'} "
                         "its owner: this node's copy is not demoted")  # fmt: skip
    if current is None or node not in current.followers:
        raise MoveFailed(session, "demote", f"{node} is not one of its followers in etcd")
    own = session_dir(home, session)
    if not os.path.isdir(own):
        there = os.path.isdir(session_dir(replicas_root(home), session))
        return {"session": session, "demoted": False, "copy": there}
    if os.path.isdir(session_dir(replicas_root(home), session)):
        label = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        set_aside(home, session, QUARANTINE_DIR, f"{label}.demoted")
        return {"session": session, "demoted": False, "copy": True}
    try:
        loaded = load_session(own, session)  # it must open as it is (its worker ended)
        with open(log_path(own, loaded.epoch), "rb") as log:
            data = log.read()
        demote(home, session, Position(loaded.epoch, len(data), zlib.crc32(data)))
    except SessionError as exc:
        raise MoveFailed(session, "demote", str(exc)) from exc
    receiver_for(home).resume(session)
    return {"session": session, "demoted": True, "copy": True}


def promote_here(client: EtcdClient, node: str, home: str, session: str) -> dict[str, object]:
    """The new owner's step: its follower's copy becomes its session (as a failover's)."""
    owner = owner_of(client, session)
    if owner is None or owner.node != node:
        raise MoveFailed(session, "promote", f"etcd names {owner.node if owner else 'nobody'} "
                         "its owner, not this node")  # fmt: skip
    if os.path.isdir(os.path.join(home, SESSIONS_DIR, session)):
        return {"session": session, "promoted": False}  # the failover watch was first
    receiver_for(home).release(session)
    try:
        promote(home, session)
    except SessionError as exc:
        if os.path.isdir(os.path.join(home, SESSIONS_DIR, session)):
            return {"session": session, "promoted": False}
        raise MoveFailed(session, "promote", str(exc)) from exc
    return {"session": session, "promoted": True}


def unfollow_here(client: EtcdClient, node: str, home: str, session: str) -> dict[str, object]:
    """A follower taken out of the replica set: its copy is set aside in the replicas
    home's ``quarantine/`` (never deleted), once etcd no longer lists it a follower."""
    owner = owner_of(client, session)
    current = replicas_of(client, session)
    if (owner is not None and owner.node == node) or (
        current is not None and node in current.followers
    ):
        raise MoveFailed(session, "unfollow", f"{node} still holds a copy etcd counts")
    receiver_for(home).release(session)
    root = replicas_root(home)
    if not os.path.isdir(session_dir(root, session)):
        return {"session": session, "unfollowed": False}
    label = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    set_aside(root, session, QUARANTINE_DIR, f"{label}.unfollowed")
    receiver_for(home).resume(session)  # it may follow the session again some day
    return {"session": session, "unfollowed": True}
