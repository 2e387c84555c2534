"""The owner's channel to one follower node over the cluster transport (TLS, node role).

``worker.replication.Shipper`` ships through it: each step is one ``replicate`` request
on a persistent TLS connection (``peer_link.NodeLink``, this node's certificate, opened
with the replication channel's preamble: a thread of the follower's own serves it), and
its reply is the follower's position once the step is durable there. Any failure (no
connection, a refusal, no reply within the timeout) is a ``ShipFailed`` naming the
node and why, in one line.
"""

from __future__ import annotations

from supervisor.cluster.peer_link import NodeLink
from supervisor.cluster.transport import REPLICA_PREAMBLE, TlsFiles
from supervisor.errors import ControlError
from worker.catch_up import ShipFailed
from worker.follower_tls import parse_line_ends
from worker.store.replica_types import Position, Step

SHIP_TIMEOUT = 5.0


class FollowerLink:
    """A ``worker.replication.FollowerChannel`` to the follower ``node`` at ``address``."""

    def __init__(
        self, node: str, address: str, files: TlsFiles, *, timeout: float = SHIP_TIMEOUT
    ) -> None:
        self._node = node
        self._link = NodeLink(address, node, files, timeout=timeout, preamble=REPLICA_PREAMBLE)

    @property
    def node(self) -> str:
        return self._node

    def close(self) -> None:
        self._link.close()

    def ship(self, step: Step) -> Position:
        position = self._position(self._call("replicate", step=step.to_message()), required=True)
        assert position is not None  # required
        return position

    def position(self, session: str) -> Position | None:
        return self._position(self._call("replica_position", session=session), required=False)

    def line_ends(self, session: str, epoch: int) -> tuple[int, list[list[int]]]:
        result = self._call("replica_line_ends", session=session, epoch=epoch)
        return parse_line_ends(self._node, result)

    def rewind(self, session: str, keep: Position, token: int) -> Position:
        result = self._call(
            "replica_rewind", session=session, position=keep.to_message(), token=token
        )
        position = self._position(result, required=True)
        assert position is not None  # required
        return position

    def _call(self, op: str, **fields: object) -> object:
        try:
            return self._link.call(op, **fields)
        except ControlError as exc:
            raise ShipFailed(f"{self._node}: {exc.code}: {exc.message}") from exc

    def _position(self, result: object, *, required: bool) -> Position | None:
        value = result.get("position") if isinstance(result, dict) else None
        try:
            position = Position.from_message(value)
        except ValueError as exc:
            raise ShipFailed(f"{self._node}: a bad reply: {exc}") from exc
        if position is None and required:
            raise ShipFailed(f"{self._node}: the reply holds no position")
        return position
