"""Who may write a session, proven by etcd: placement, owner keys and fencing tokens.

A session's token is the revision of the transaction that made its current owner (the
owner key's ``mod_revision``); etcd revisions grow across the whole store, so a later
owner always holds a higher token (docs/scaling.md section 3).
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.cluster.errors import AlreadyPlaced, Cordoned, NotOwner
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.etcd_types import Delete, Get, Put, TxnResult, absent, modified_at, value_is
from supervisor.cluster.keys import (
    cordon_key,
    move_key,
    node_of,
    node_value,
    owner_key,
    placement_key,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnerRecord:
    """The current owner of a session as etcd holds it."""

    node: str
    token: int
    lease: int


def owner_of(client: EtcdClient, session: str) -> OwnerRecord | None:
    """Return the session's current owner, or None when nobody owns it."""
    kv = client.get(owner_key(session))
    if kv is None:
        return None
    return OwnerRecord(node=node_of(kv.value), token=kv.mod_revision, lease=kv.lease)


def placement_of(client: EtcdClient, session: str) -> str | None:
    """Return the node whose disk holds the session, or None when it is placed nowhere."""
    kv = client.get(placement_key(session))
    return None if kv is None else node_of(kv.value)


def place_new(client: EtcdClient, session: str, node: str, lease: int) -> int:
    """Place a new session on ``node`` and make it the owner; return the token.

    AlreadyPlaced if the session is already placed anywhere (ids are cluster-wide);
    Cordoned if ``node`` is cordoned (checked in the same transaction).
    """
    placement, owner = placement_key(session), owner_key(session)
    result = client.txn(
        [absent(placement), absent(owner), absent(cordon_key(node))],
        [
            Put(key=placement, value=node_value(node)),
            Put(key=owner, value=node_value(node), lease=lease),
        ],
        [Get(key=placement), Get(key=cordon_key(node))],
    )
    if not result.succeeded:
        if result.reads[0] or not result.reads[1]:
            where = node_of(result.reads[0][0].value) if result.reads[0] else "a node"
            raise AlreadyPlaced(session, where)
        raise Cordoned(session, node)
    return result.revision


def place_or_resume(client: EtcdClient, session: str, node: str, lease: int) -> int:
    """``place_new``, or take up a placement on ``node`` that no other node owns; the token.

    Only for a node that holds no files of the session and does not host it (the caller
    checks): such a placement is this node's own create whose reply etcd sent and the
    node never read (a timeout), or whose files were never written. Owned under this
    node's lease it is resumed with its token, owned by nobody it is acquired; anything
    else (another node, another lease, a move) stays AlreadyPlaced or NotOwner.
    """
    try:
        return place_new(client, session, node, lease)
    except AlreadyPlaced as exc:
        if exc.node != node:
            raise
    owner = owner_of(client, session)
    if owner is None:
        return acquire(client, session, node, lease)
    if owner.node == node and owner.lease == lease:
        return owner.token
    raise AlreadyPlaced(session, node)


def acquire(client: EtcdClient, session: str, node: str, lease: int) -> int:
    """Become the owner of a session placed on ``node`` that nobody owns; return the token.

    A session in a move is owned only through the move (NotOwner until it ends).
    """
    placement, owner = placement_key(session), owner_key(session)
    result = client.txn(
        [absent(owner), value_is(placement, node_value(node)), absent(move_key(session))],
        [Put(key=owner, value=node_value(node), lease=lease)],
        [Get(key=owner), Get(key=placement), Get(key=move_key(session))],
    )
    if not result.succeeded:
        raise NotOwner(session, _why_not(result, node))
    return result.revision


def unplace(client: EtcdClient, session: str, node: str, token: int) -> bool:
    """Undo a new session's placement on ``node`` owned with ``token`` (no files were made).

    False if either changed meanwhile (then nothing is deleted).
    """
    placement, owner = placement_key(session), owner_key(session)
    return client.txn(
        [modified_at(owner, token), value_is(placement, node_value(node))],
        [Delete(key=owner), Delete(key=placement)],
    ).succeeded


def release(client: EtcdClient, session: str, token: int) -> bool:
    """Give up ownership held with ``token``; False if it was no longer held with it."""
    return client.txn(
        [modified_at(owner_key(session), token)], [Delete(key=owner_key(session))]
    ).succeeded


def _why_not(result: TxnResult, node: str) -> str:
    owners, placements, moves = result.reads
    if moves:
        return "a move is in progress: finish it with `loopd move` or abort it"
    if owners:
        holder = node_of(owners[0].value)
        return f"owned by {holder} (token {owners[0].mod_revision})"
    if not placements:
        return "the session is placed nowhere"
    return f"its files are placed on {node_of(placements[0].value)}, not on {node}"
