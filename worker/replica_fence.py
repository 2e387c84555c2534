"""A replicated session's worker: its lease fence, with every in-sync follower's ack.

The server checks its fence before a chunk is written and again after its fdatasync,
before any reply (``worker/server.py``). In a replicated session each group the chunk
writes goes to every in-sync follower as soon as it is written, during the owner's
fdatasync, while the lease is proven (``written``, the session's ``on_written``), and
that second check ships what was not handed over and waits for each follower's
acknowledgement (``worker.replication.Shipper``); a follower that fails is out of the
worker's in-sync set at once, the chunk is answered as not acknowledged, and the daemon
is asked (an ``in_sync`` request on its control socket, answered once etcd's in-sync
set is changed under the owner's token) before the worker acknowledges anything
without it. The first check refuses a write, before a byte of it, while fewer copies
are in sync than the session needs (a majority of its copies), and first tries (at
most every ``REJOIN_INTERVAL``) to catch the missing followers up and take them back.
Between batches (``idle``, every ``IDLE_TICK`` while one is out) the same is done with
no write at all: the followers that answered a probe are caught up and added back.

The daemon gives the worker what it needs: the followers' names and ``tls://``
addresses, the in-sync set etcd holds, and the node certificate's files
(``add_arguments``). Nothing of the supervisor is imported.
"""

from __future__ import annotations

import argparse
import socket
import time
from typing import Final

from worker.follower_tls import TlsFollower, node_context
from worker.lease_deadline import LeaseFence, lease_proven
from worker.replication import Shipper
from worker.store.errors import NotOwnerNow
from worker.store.session import Session
from worker.store.stats import STATS
from worker.wire import FrameReader, Message, encode

REJOIN_INTERVAL: Final = 1.0
IDLE_TICK: Final = 0.1  # seconds between the loop's idle calls while a follower is out
CHECK_SLICE: Final = 0.02  # seconds of a catch-up's shipping before a write (idle: more)
DAEMON_TIMEOUT: Final = 5.0  # the daemon's etcd call ends within 2 s (CALL_TIMEOUT)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The worker's replication options (given by the daemon of a replicated session)."""
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--follower", action="append", default=[], help="NAME=tls://HOST:PORT")
    parser.add_argument("--in-sync", default="", help="the followers in sync, comma-separated")
    parser.add_argument("--min-in-sync", type=int, default=None)
    parser.add_argument("--node-tls", nargs=3, default=None, metavar=("CA", "CERT", "KEY"))
    parser.add_argument("--daemon-socket", default=None, help="the daemon's control socket")


class ReplicatedFence(LeaseFence):
    """``LeaseFence.check`` and then the followers': what the server calls around a chunk."""

    def __init__(
        self, path: str, lease: int, token: int, shipper: Shipper, daemon_socket: str
    ) -> None:
        super().__init__(path, lease, token)
        self.shipper = shipper
        self.daemon_socket = daemon_socket
        self._rejoin_after = 0.0

    def check(self) -> None:
        super().check()
        shipper = self.shipper
        lost = shipper.ship()
        if lost is not None:
            raise lost
        if shipper.in_sync != set(shipper.followers) and time.monotonic() >= self._rejoin_after:
            self._rejoin_after = time.monotonic() + REJOIN_INTERVAL
            shipper.rejoin_answering(CHECK_SLICE)
        shipper.check_writable()

    def written(self, epoch: int, offset: int, prior_crc: int, data: bytes) -> None:
        """``Session.on_written``: the group just written goes to the followers during the
        owner's fdatasync, if the lease is proven now (nothing leaves the owner without
        it: the check after the fdatasync then refuses the chunk before it is shipped)."""
        try:
            proven = lease_proven(self._fd, self.lease)
        except OSError:
            return  # unreadable: not proven (the check after the fdatasync says why)
        if proven:
            self.shipper.written(epoch, offset, prior_crc, data)

    def idle(self) -> float | None:
        """Between batches, with or without writes: the followers out of sync that answered
        a probe (made off this thread) are caught up and added back, so an idle session,
        or one refusing writes, regains its in-sync set as soon as a follower answers.
        Called again within ``IDLE_TICK`` while any follower is out of sync."""
        shipper = self.shipper
        if shipper.in_sync | shipper.unconfirmed >= set(shipper.followers):
            return None
        try:
            LeaseFence.check(self)  # a deposed or unproven owner catches nobody up
        except NotOwnerNow:
            return time.monotonic() + IDLE_TICK
        shipper.rejoin_answering()
        return time.monotonic() + IDLE_TICK

    def progressed(self) -> bool:
        return self.shipper.progressed()

    def change_in_sync(self, node: str, in_sync: bool) -> None:
        """Have the daemon change etcd's in-sync set, and wait until it did (``Shipper``'s
        callback); OSError or RuntimeError (one line) if it did not."""
        session = self.shipper.session.id
        request = {"id": 1, "op": "in_sync", "session": session, "node": node, "in_sync": in_sync}
        reply = _ask(self.daemon_socket, request)
        if reply.get("ok") is not True:
            failure = reply.get("error")
            why = failure.get("message") if isinstance(failure, dict) else reply
            raise RuntimeError(f"the daemon did not change the in-sync set: {why}")

    def close(self) -> None:
        self.shipper.session.on_written = None
        self.shipper.close()
        for channel in self.shipper.followers.values():
            if isinstance(channel, TlsFollower):
                channel.close()
        super().close()


def replicated_fence(args: argparse.Namespace, session: Session, fence: LeaseFence) -> LeaseFence:
    """The fence of a session with ``--replicas`` above 1, else ``fence`` as it is."""
    if args.replicas <= 1:
        return fence
    if args.node_tls is None or args.daemon_socket is None:
        raise ValueError("a replicated session's worker needs --node-tls and --daemon-socket")
    context = node_context(*args.node_tls)
    followers = []
    for spec in args.follower:
        name, _, address = spec.partition("=")
        followers.append(TlsFollower(name, address, context))
    in_sync = [name for name in args.in_sync.split(",") if name]
    holder: list[ReplicatedFence] = []

    def change(node: str, in_sync: bool) -> None:
        holder[0].change_in_sync(node, in_sync)

    shipper = Shipper(
        session, fence.token, args.replicas, followers, in_sync, change, args.min_in_sync
    )
    fence.close()
    replicated = ReplicatedFence(fence.path, fence.lease, fence.token, shipper, args.daemon_socket)
    holder.append(replicated)
    session.on_written = replicated.written  # each group shipped while it is fdatasynced
    STATS.replication = shipper.report  # each state report carries the followers' lag
    return replicated


def _ask(path: str, request: Message) -> Message:
    """One request to the daemon's control socket and its reply (OSError if none)."""
    deadline = time.monotonic() + DAEMON_TIMEOUT
    reader = FrameReader()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(DAEMON_TIMEOUT)
        sock.connect(path)
        sock.sendall(encode(request))
        while time.monotonic() < deadline:
            data = sock.recv(1 << 16)
            if not data:
                break
            replies = reader.feed(data)
            if replies:
                return replies[0]
    raise OSError(f"the daemon at {path} did not answer")
