"""Moving a session kept in a database: an ownership change, no file copied.

The source's worker is stopped, the target made the owner (and the placement) in one
transaction that compares the source's token (``move.take_ownership``), and the target
opens the session from the database with the new, higher token; a write of a source
worker not yet stopped is refused in its transaction. A node says in its registration
that its sessions are in a database (``stored``).
"""

from __future__ import annotations

from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import decode_value, node_key


def node_is_stored(client: EtcdClient, node: str) -> bool:
    """True if ``node`` registered that its sessions are in a database."""
    kv = client.get(node_key(node))
    return kv is not None and decode_value(kv.value).get("stored") is True
