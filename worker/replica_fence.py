"""A replicated session's worker: its lease fence, with every in-sync follower's ack.

The server checks its fence before a chunk is written and again after its fdatasync,
before any reply (``worker/server.py``). In a replicated session that second check
ships what the chunk wrote to every in-sync follower and waits for each one's
acknowledgement (``worker.replication.Shipper``); a follower that fails is out of the
worker's in-sync set at once, the chunk is answered as not acknowledged, and the daemon
is told (``{"op": "state", "in_sync": {...}}`` on the control channel) so that it
removes the follower from the in-sync set in etcd under the owner's token. The first
check refuses a write, before a byte of it, while fewer copies are in sync than the
session asks for, and first tries (at most every ``REJOIN_INTERVAL``) to catch the
missing followers up and take them back.

The daemon gives the worker what it needs: the followers' names and ``tls://``
addresses, the in-sync set etcd holds, and the node certificate's files
(``add_arguments``). Nothing of the supervisor is imported.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Final

from worker.follower_tls import TlsFollower, node_context
from worker.lease_deadline import LeaseFence
from worker.replication import Shipper
from worker.store.session import Session
from worker.wire import Message

REJOIN_INTERVAL: Final = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The worker's replication options (given by the daemon of a replicated session)."""
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--follower", action="append", default=[], help="NAME=tls://HOST:PORT")
    parser.add_argument("--in-sync", default="", help="the followers in sync, comma-separated")
    parser.add_argument("--node-tls", nargs=3, default=None, metavar=("CA", "CERT", "KEY"))


class ReplicatedFence(LeaseFence):
    """``LeaseFence.check`` and then the followers': what the server calls around a chunk."""

    def __init__(self, path: str, lease: int, token: int, shipper: Shipper) -> None:
        super().__init__(path, lease, token)
        self.shipper = shipper
        self.notify: Callable[[Message], None] | None = None  # the control channel's queue
        self._rejoin_after = 0.0

    def check(self) -> None:
        super().check()
        shipper = self.shipper
        lost = shipper.ship()
        if lost is not None:
            raise lost
        if shipper.in_sync != set(shipper.followers) and time.monotonic() >= self._rejoin_after:
            self._rejoin_after = time.monotonic() + REJOIN_INTERVAL
            shipper.rejoin()
        shipper.check_writable()

    def change_in_sync(self, node: str, in_sync: bool) -> None:
        """Ask the daemon to change etcd's in-sync set (``Shipper``'s callback)."""
        if self.notify is not None:
            self.notify({"op": "state", "in_sync": {"node": node, "in_sync": in_sync}})

    def close(self) -> None:
        self.shipper.close()
        for channel in self.shipper.followers.values():
            if isinstance(channel, TlsFollower):
                channel.close()
        super().close()


def replicated_fence(args: argparse.Namespace, session: Session, fence: LeaseFence) -> LeaseFence:
    """The fence of a session with ``--replicas`` above 1, else ``fence`` as it is."""
    if args.replicas <= 1:
        return fence
    if args.node_tls is None:
        raise ValueError("a replicated session's worker needs --node-tls CA CERT KEY")
    context = node_context(*args.node_tls)
    followers = []
    for spec in args.follower:
        name, _, address = spec.partition("=")
        followers.append(TlsFollower(name, address, context))
    in_sync = [name for name in args.in_sync.split(",") if name]
    holder: list[ReplicatedFence] = []

    def change(node: str, in_sync: bool) -> None:
        holder[0].change_in_sync(node, in_sync)

    shipper = Shipper(session, fence.token, args.replicas, followers, in_sync, change)
    fence.close()
    replicated = ReplicatedFence(fence.path, fence.lease, fence.token, shipper)
    holder.append(replicated)
    return replicated
