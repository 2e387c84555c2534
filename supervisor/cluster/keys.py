"""The cluster's etcd keys and their values (docs/scaling.md section 1).

Values are canonical JSON (sorted keys, no spaces) so that a transaction can compare a
value byte for byte (``value_is``).
"""

from __future__ import annotations

import json
from typing import Final

from supervisor.cluster.errors import BadClusterValue
from worker.store.errors import InvalidSessionId
from worker.store.session_id import validate_session_id

PREFIX: Final = "/loopd/"


def check_node_name(name: object) -> str:
    """Return ``name`` if it is a valid node name (the session-id rule), else ValueError."""
    try:
        return validate_session_id(name)
    except InvalidSessionId as exc:
        raise ValueError(f"invalid node name {name!r}: {exc.why}") from exc


def node_key(node: str) -> str:
    """``/loopd/nodes/<node>``: the node is alive (bound to its lease) and its address."""
    return f"{PREFIX}nodes/{check_node_name(node)}"


def nodes_prefix() -> str:
    """The prefix under which every live node is registered."""
    return f"{PREFIX}nodes/"


def placement_key(session: str) -> str:
    """``/loopd/placement/<id>``: which node's disk holds the session (durable)."""
    return f"{PREFIX}placement/{validate_session_id(session)}"


def placements_prefix() -> str:
    """The prefix of every placement key."""
    return f"{PREFIX}placement/"


def owner_key(session: str) -> str:
    """``/loopd/owner/<id>``: who may write now; its mod revision is the fencing token."""
    return f"{PREFIX}owner/{validate_session_id(session)}"


def move_key(session: str) -> str:
    """``/loopd/moves/<id>``: a move in progress, for a rerun to finish (durable)."""
    return f"{PREFIX}moves/{validate_session_id(session)}"


def cordon_key(node: str) -> str:
    """``/loopd/cordoned/<node>``: no new session is placed on the node (durable)."""
    return f"{PREFIX}cordoned/{check_node_name(node)}"


def cordons_prefix() -> str:
    """The prefix of every cordon key."""
    return f"{PREFIX}cordoned/"


def encode_value(value: dict[str, object]) -> bytes:
    """Return ``value`` as canonical JSON bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")


def decode_value(data: bytes) -> dict[str, object]:
    """Decode a value written by ``encode_value``; BadClusterValue if it is not a JSON object."""
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise BadClusterValue(data, f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise BadClusterValue(data, "not a JSON object")
    return value


def node_value(node: str) -> bytes:
    """The value of a placement or owner key naming ``node``."""
    return encode_value({"node": check_node_name(node)})


def node_of(data: bytes) -> str:
    """The node named by a placement or owner value."""
    node = decode_value(data).get("node")
    if not isinstance(node, str):
        raise BadClusterValue(data, "no node named")
    return node
