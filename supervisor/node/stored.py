"""Sessions kept in a database (``--store postgresql://...``): ownership is etcd's alone.

A node holds no copy of such a session: any node may serve it once etcd makes it the
owner, and its worker opens it from the database with the owner's token, which every
write transaction checks (docs/scaling.md section 0.3). So a node claims the sessions
placed on it (``placed_on``) without opening anything, and a session whose node's lease
expired is taken over by another node in one transaction (``take_over_stored``):
nothing is copied.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from supervisor.cluster.errors import NotOwner
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.etcd_types import Get, Put, absent, value_is
from supervisor.cluster.keys import (
    move_key,
    node_key,
    node_of,
    node_value,
    owner_key,
    placement_key,
    placements_prefix,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredTakeover:
    """A takeover made: the new token, and the node the session was placed on before."""

    token: int
    previous: str


def placements(client: EtcdClient) -> dict[str, str]:
    """Every placed session and the node it is placed on."""
    prefix = placements_prefix()
    return {kv.key.removeprefix(prefix): node_of(kv.value) for kv in
            client.range(prefix, prefix=True)}  # fmt: skip


def placed_on(client: EtcdClient, node: str) -> list[str]:
    """The sessions placed on ``node``, sorted."""
    return sorted(s for s, n in placements(client).items() if n == node)


def orphans(client: EtcdClient, node: str) -> dict[str, bytes]:
    """The sessions placed on another node that is not registered (its lease expired):
    each with its placement's value as stored (``node_of`` names that node)."""
    found = {}
    alive: dict[str, bool] = {}
    prefix = placements_prefix()
    for kv in client.range(prefix, prefix=True):
        placed = node_of(kv.value)
        if placed == node:
            continue
        if placed not in alive:
            alive[placed] = client.get(node_key(placed)) is not None
        if not alive[placed]:
            found[kv.key.removeprefix(prefix)] = kv.value
    return found


def takeover_order(sessions: Iterable[str], node: str) -> list[str]:
    """``sessions`` in an order of ``node``'s own (a hash of node and session): the nodes
    taking over a lost node's sessions at once start apart instead of racing for each
    one in turn, so the work is split and each takeover costs about one round trip."""
    return sorted(sessions, key=lambda s: hashlib.blake2b(f"{node}/{s}".encode()).digest())


def take_over_stored(
    client: EtcdClient, session: str, node: str, lease: int, placed: bytes | None = None
) -> StoredTakeover:
    """Make ``node`` the owner and the placement of ``session``, whose node's lease expired.

    One transaction: nobody owns the session, it is still placed on the node read, that
    node is not registered (a node back under a new lease claims its own sessions), and
    no move is in progress. Its revision is the new token, higher than any before.
    NotOwner (one line) if any of it does not hold; nothing is written then. ``placed``:
    the placement's value as just read (``orphans``), saving a read.
    """
    if placed is None:
        found = client.get(placement_key(session))
        if found is None:
            raise NotOwner(session, "the session is placed nowhere")
        placed = found.value
    previous = node_of(placed)
    result = client.txn(
        [
            absent(owner_key(session)),
            value_is(placement_key(session), placed),
            absent(node_key(previous)),
            absent(move_key(session)),
        ],
        [
            Put(key=owner_key(session), value=node_value(node), lease=lease),
            Put(key=placement_key(session), value=node_value(node)),
        ],
        [Get(key=owner_key(session))],
    )
    if not result.succeeded:
        owners = result.reads[0]
        if owners:
            holder = node_of(owners[0].value)
            raise NotOwner(session, f"owned by {holder} (token {owners[0].mod_revision})")
        raise NotOwner(session, f"{previous} is back, or it moved or was placed again: retry")
    return StoredTakeover(token=result.revision, previous=previous)
