"""Finding a session's owner and its address, and refusing replies from a former owner."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from supervisor.cluster.errors import NotOwner, StaleOwner
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import decode_value, node_key, nodes_prefix
from supervisor.cluster.ownership import owner_of


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """Where to send a session's requests: its owner node, the token, the node's address."""

    session: str
    node: str
    token: int
    address: str


def node_address(client: EtcdClient, node: str) -> str | None:
    """A live node's address (``unix:/path`` or ``tls://host:port``); None if not registered."""
    kv = client.get(node_key(node))
    if kv is None:
        return None
    address = decode_value(kv.value).get("address")
    return address if isinstance(address, str) else None


def live_nodes(client: EtcdClient) -> dict[str, str]:
    """Return every registered node and its address."""
    prefix = nodes_prefix()
    nodes = {}
    for kv in client.range(prefix, prefix=True):
        address = decode_value(kv.value).get("address")
        if isinstance(address, str):
            nodes[kv.key.removeprefix(prefix)] = address
    return nodes


def route(client: EtcdClient, session: str) -> Route:
    """Return where the session's owner is; NotOwner when nobody (reachable) owns it."""
    owner = owner_of(client, session)
    if owner is None:
        raise NotOwner(session, "no node owns it now (its node is down, or it is moving)")
    address = node_address(client, owner.node)
    if address is None:
        raise NotOwner(session, f"its owner {owner.node} is not registered")
    return Route(session=session, node=owner.node, token=owner.token, address=address)


def unix_socket_path(address: str) -> str:
    """Return the socket path of a ``unix:`` address; ValueError for any other transport."""
    if not address.startswith("unix:"):
        raise ValueError(f"{address!r} is not a unix: address (a node on this machine)")
    return address.removeprefix("unix:")


class TokenGuard:
    """The highest fencing token seen per session; a reply with a lower one is refused."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, int] = {}

    def check(self, session: str, token: int) -> None:
        """Accept ``token`` for ``session`` (raising the mark), or raise StaleOwner."""
        with self._lock:
            seen = self._seen.get(session, 0)
            if token < seen:
                raise StaleOwner(session, token, seen)
            self._seen[session] = token

    def seen(self, session: str) -> int:
        """The highest token seen for ``session`` (0: none)."""
        with self._lock:
            return self._seen.get(session, 0)
