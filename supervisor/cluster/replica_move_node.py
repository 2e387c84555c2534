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
from supervisor.cluster.keys import move_key
from supervisor.cluster.move import MoveIntent
from supervisor.cluster.ownership import owner_of, placement_of
from supervisor.cluster.replica_receiver import receiver_for
from supervisor.cluster.replica_set import replicas_of
from supervisor.cluster.session_files import QUARANTINE_DIR, remove_released, set_aside
from worker.store.errors import SessionError
from worker.store.layout import SESSIONS_DIR, session_dir
from worker.store.loader import load_session
from worker.store.replica_roles import demote, promote, replicas_root
from worker.store.replica_types import Position
from worker.store.session_state import log_path


def demote_here(client: EtcdClient, node: str, home: str, session: str) -> dict[str, object]:
    """The old owner's step: its whole copy becomes a follower's copy in ``replicas/``.

    Made while etcd holds a replicated move of the session from this node (its worker
    ended: the copy's lock is free; the move key keeps this node's failover watch from
    promoting the copy back), or once etcd names another owner and this node a follower.
    Its log is kept whole (every acknowledged write is in it); a suffix its worker wrote
    and never had acknowledged is cut back by the new owner's catch-up, to quarantine.
    If a follower's copy is already there (the new owner's worker made one from nothing
    first) this node's own copy is set aside in ``quarantine/`` instead, never deleted.
    """
    owner = owner_of(client, session)
    current = replicas_of(client, session)
    moving = client.get(move_key(session))
    intent = MoveIntent.decode(session, moving.value) if moving is not None else None
    handing_over = (
        intent is not None and intent.replicated and intent.source == node
        and (owner is None or owner.node == node)
    )  # fmt: skip
    handed_over = (
        owner is not None and owner.node != node
        and current is not None and node in current.followers
    )  # fmt: skip
    if not (handing_over or handed_over):
        holder = owner.node if owner is not None else "nobody"
        raise MoveFailed(session, "demote", f"etcd names {holder} its owner and holds no "
                         f"handover from {node}: this node's copy is not demoted")  # fmt: skip
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
    receiver = receiver_for(home)
    with receiver.promotion:  # the failover watch may be promoting the same copy
        if os.path.isdir(os.path.join(home, SESSIONS_DIR, session)):
            return {"session": session, "promoted": False}  # the failover watch was first
        receiver.release(session)
        try:
            promote(home, session)
        except SessionError as exc:
            if os.path.isdir(os.path.join(home, SESSIONS_DIR, session)):
                return {"session": session, "promoted": False}
            raise MoveFailed(session, "promote", str(exc)) from exc
    return {"session": session, "promoted": True}


def unfollow_here(client: EtcdClient, node: str, home: str, session: str) -> dict[str, object]:
    """A node whose copy etcd no longer counts (a follower taken out of the replica set,
    or an old owner for which a copy was added): once etcd names it neither owner nor
    follower, nor places the session here, an old owner's ``sessions/<id>`` is removed
    (as at the end of a move: the session's copies in sync hold every acknowledged
    write) and a follower's copy is set aside in the replicas home's ``quarantine/``."""
    owner = owner_of(client, session)
    current = replicas_of(client, session)
    if (
        (owner is not None and owner.node == node)
        or (current is not None and node in current.followers)
        or placement_of(client, session) == node
    ):
        raise MoveFailed(session, "unfollow", f"{node} still holds a copy etcd counts")
    if os.path.isdir(session_dir(home, session)):
        remove_released(home, session, f"handed-over-{owner.token if owner else 0}")
    root = replicas_root(home)
    receiver = receiver_for(home)
    if not os.path.isdir(session_dir(root, session)):
        receiver.resume(session)  # promoted here once (released): it may follow it again
        return {"session": session, "unfollowed": False}
    receiver.release(session)  # closed: no step is applied to it while it is set aside
    try:
        label = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        set_aside(root, session, QUARANTINE_DIR, f"{label}.unfollowed")
    finally:
        receiver.resume(session)  # it may follow the session again some day
    return {"session": session, "unfollowed": True}
