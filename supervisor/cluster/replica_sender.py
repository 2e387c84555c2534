"""Who may write a follower's copy: the node etcd names as the session's owner.

Any node certificate of the cluster reaches a follower's ``replicate`` and
``replica_rewind``; the copy's own fence refuses a token lower than it has seen, but a
higher one from a node that does not own the session would raise that fence for good
(the real owner's steps then refused) or cut an unacknowledged tail into quarantine.
So before a step or a rewind is applied, its sender (the node names of its certificate)
and its token must be those of the session's owner in etcd (``ownership.owner_of``:
the owner key's node and its revision, the token). The last owner confirmed for each
session is kept: etcd is asked again only when a step's sender or token differs (a
failover, a restart), not at every group commit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from supervisor.cluster.errors import ClusterError
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.ownership import OwnerRecord, owner_of
from supervisor.cluster.transport import TlsFiles, TransportError
from worker.wire import Message

CALL_TIMEOUT = 2.0


class NotTheOwner(Exception):
    """The sender is not the session's owner in etcd, or etcd could not say (one line)."""


class SenderCheck:
    """Checks a replica write's sender against the session's owner in etcd."""

    def __init__(self, owner: Callable[[str], OwnerRecord | None]) -> None:
        self._owner = owner
        self._confirmed: dict[str, tuple[str, int]] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_cluster(cls, url: str, tls: TlsFiles | None) -> SenderCheck:
        """A check asking the cluster's etcd (one client, used under a lock)."""
        client: list[EtcdClient] = []
        lock = threading.Lock()

        def lookup(session: str) -> OwnerRecord | None:
            with lock:
                if not client:
                    context = tls.etcd_context() if tls is not None else None
                    client.append(EtcdClient(url, timeout=CALL_TIMEOUT, tls=context))
                return owner_of(client[0], session)

        return cls(lookup)

    def check(self, message: Message, names: list[str]) -> None:
        """NotTheOwner unless a node of ``names`` owns the session with the message's token."""
        step = message.get("step")
        fields = step if isinstance(step, dict) else message
        session, token = fields.get("session"), fields.get("token")
        if not isinstance(session, str) or type(token) is not int:
            return  # malformed: the receiver refuses it in its own words, writing nothing
        with self._lock:
            confirmed = self._confirmed.get(session)
        if confirmed is not None and confirmed[1] == token and confirmed[0] in names:
            return
        try:
            owner = self._owner(session)
        except (ClusterError, TransportError, OSError, ValueError) as exc:
            raise NotTheOwner(f"{session}: etcd could not say who owns it ({exc}); "
                              "nothing was written") from exc  # fmt: skip
        if owner is None or owner.node not in names or owner.token != token:
            says = "no owner" if owner is None else f"owner {owner.node} with token {owner.token}"
            raise NotTheOwner(
                f"{session}: {'/'.join(names) or 'a node'} with token {token} is not its "
                f"owner (etcd names {says}); nothing was written"
            )
        with self._lock:
            self._confirmed[session] = (owner.node, owner.token)
