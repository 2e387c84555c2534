"""A replicated session's followers and in-sync set in etcd (docs/scaling.md, "Replication").

``/loopd/replicas/<id>`` holds ``{"replicas": N, "followers": [...], "in_sync": [...],
"addresses": {...}}``
(durable, no lease): how many copies the session asks for (its owner's included), the
nodes that hold a follower's copy, and those of them that hold every group the owner
acknowledged, and the ``tls://`` address of every node that held a copy when it was
placed (a node whose registration is gone, a dead owner, is still reached there when
it returns). It is written only in transactions that also compare the owner key's
``mod_revision`` with the writer's token: a deposed owner changes nothing, and two
writes of one owner never interleave (each compares the key's own revision too).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from supervisor.cluster.errors import BadClusterValue, NotOwner
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.etcd_types import Get, Put, absent, modified_at
from supervisor.cluster.keys import PREFIX, check_node_name, decode_value, encode_value, owner_key
from worker.store.session_id import validate_session_id

_ATTEMPTS = 5


def replicas_key(session: str) -> str:
    """``/loopd/replicas/<id>``: the session's followers and in-sync set (durable)."""
    return f"{PREFIX}replicas/{validate_session_id(session)}"


@dataclass(frozen=True, slots=True)
class ReplicaSet:
    """What etcd holds of a replicated session, and the revision it was read at."""

    replicas: int
    followers: tuple[str, ...]
    in_sync: tuple[str, ...]
    revision: int = 0  # the key's mod_revision when read (0: not written yet)
    addresses: tuple[tuple[str, str], ...] = ()  # (node, tls:// address), by node

    def value(self) -> bytes:
        return encode_value(
            {"replicas": self.replicas, "followers": list(self.followers),
             "in_sync": list(self.in_sync), "addresses": dict(self.addresses)}
        )  # fmt: skip


def parse_replica_set(data: bytes, revision: int) -> ReplicaSet:
    """Decode a ``replicas`` value; BadClusterValue naming what is wrong."""
    value = decode_value(data)
    replicas, followers = value.get("replicas"), value.get("followers")
    in_sync = value.get("in_sync")
    if type(replicas) is not int or replicas < 1:
        raise BadClusterValue(data, "'replicas' must be an integer >= 1")
    if not isinstance(followers, list) or not all(isinstance(n, str) for n in followers):
        raise BadClusterValue(data, "'followers' must be a list of node names")
    if not isinstance(in_sync, list) or not set(in_sync) <= set(followers):
        raise BadClusterValue(data, "'in_sync' must be a list of followers")
    addresses = value.get("addresses", {})
    if not isinstance(addresses, dict) or not all(isinstance(a, str) for a in addresses.values()):
        raise BadClusterValue(data, "'addresses' must map node names to addresses")
    known = tuple(sorted((str(node), str(where)) for node, where in addresses.items()))
    return ReplicaSet(replicas, tuple(followers), tuple(in_sync), revision, known)


def replicas_of(client: EtcdClient, session: str) -> ReplicaSet | None:
    """The session's replica set, or None for a session without followers."""
    kv = client.get(replicas_key(session))
    return None if kv is None else parse_replica_set(kv.value, kv.mod_revision)


def place_replicas(
    client: EtcdClient, session: str, token: int, replicas: int, followers: list[str],
    addresses: dict[str, str] | None = None,
) -> ReplicaSet:  # fmt: skip
    """Write a new session's followers (all in sync: their copies are made before any
    write is acknowledged); NotOwner unless ``token`` is the owner's and none is there."""
    if replicas < 1 or len(followers) != replicas - 1 or len(set(followers)) != len(followers):
        raise ValueError(f"{replicas} replicas need {replicas - 1} distinct followers")
    for name in followers:
        check_node_name(name)
    known = tuple(sorted((addresses or {}).items()))
    wanted = ReplicaSet(replicas, tuple(followers), tuple(followers), 0, known)
    key = replicas_key(session)
    result = client.txn(
        [modified_at(owner_key(session), token), absent(key)], [Put(key=key, value=wanted.value())]
    )
    if not result.succeeded:
        raise NotOwner(session, f"token {token} is not the owner's, or its replicas are placed")
    return dataclasses.replace(wanted, revision=result.revision)


def change_in_sync(
    client: EtcdClient, session: str, token: int, *, remove: str | None = None,
    add: str | None = None,
) -> ReplicaSet:  # fmt: skip
    """Remove a follower from the in-sync set, or add one back; the set as written.

    One transaction guarded by the owner's ``token`` and the key's revision as read
    (retried if only the key changed, by this same owner). NotOwner if the token is
    no longer the owner's: nothing changed.
    """
    key = replicas_key(session)
    for _ in range(_ATTEMPTS):
        current = replicas_of(client, session)
        if current is None:
            raise NotOwner(session, "the session has no replica set")
        names = [n for n in current.in_sync if n != remove]
        if add is not None and add not in names:
            if add not in current.followers:
                raise ValueError(f"{add} is not a follower of {session}")
            names.append(add)
        wanted = dataclasses.replace(current, in_sync=tuple(names), revision=0)
        if wanted.in_sync == current.in_sync:
            return current
        result = client.txn(
            [modified_at(owner_key(session), token), modified_at(key, current.revision)],
            [Put(key=key, value=wanted.value())],
            [Get(key=owner_key(session))],
        )
        if result.succeeded:
            return dataclasses.replace(wanted, revision=result.revision)
        owners = result.reads[0]
        if not owners or owners[0].mod_revision != token:
            raise NotOwner(session, f"token {token} is no longer the owner's")
    raise NotOwner(session, f"the replica set changed {_ATTEMPTS} times while it was written")
