"""Automatic failover: a follower node watches the owners of the sessions it follows.

Every ``interval`` seconds (a third of the lease TTL) a thread of the node looks at
each copy in ``<home>/replicas/sessions/``: when etcd names no owner of the session
(the owner's lease expired with its node) and this node is in the session's in-sync
set, it takes the session over (``failover.take_over``: one transaction, a higher
token), closes the copy the TLS gateway holds open, promotes it
(``worker.store.replica_roles.promote``) and hands it to the daemon, which claims it
(``Owner{me, T'}`` into its log) and starts its worker, shipping to the followers left.
Of two in-sync followers the first to try wins; the other finds an owner.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from supervisor.cluster.errors import ClusterError
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.failover import take_over
from supervisor.cluster.keys import move_key
from supervisor.cluster.node import ClusterNode
from supervisor.cluster.ownership import owner_of
from supervisor.cluster.replica_receiver import receiver_for
from supervisor.cluster.replica_set import replicas_of
from supervisor.cluster.session_files import QUARANTINE_DIR, set_aside
from worker.store.errors import SessionError
from worker.store.layout import SESSIONS_DIR
from worker.store.replica_roles import promote, replicas_root


class FailoverWatch:
    """The thread that takes over the sessions whose owner is gone, when this node may."""

    def __init__(
        self,
        client: EtcdClient,
        node: ClusterNode,
        interval: float,
        on_promoted: Callable[[str, int], None],
        report: Callable[[str], None],
    ) -> None:
        self.client = client
        self.node = node
        self.interval = interval
        self.on_promoted = on_promoted  # (session, token): called in this thread
        self.report = report
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="loopd-failover", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            promoted = self.scan()
            self.adopt_unserved(skip=frozenset(promoted))

    def scan(self) -> list[str]:
        """Take over every followed session that has no owner and names this node in
        sync; the sessions promoted here. A copy etcd already names this node the owner
        of (its promotion failed, e.g. the copy was still locked by the receiver) is
        promoted again: no other node may take it over while this one holds it."""
        copies = os.path.join(replicas_root(self.node.home), SESSIONS_DIR)
        names = sorted(os.listdir(copies)) if os.path.isdir(copies) else []
        promoted = []
        for session in names:
            if self._stop.is_set() or self.node.lease.stopping:
                break
            try:
                owner = owner_of(self.client, session)
                if owner is not None and owner.node != self.node.name:
                    continue
                if owner is not None and self.client.get(move_key(session)) is not None:
                    continue  # a replicated move is demoting this owner's copy (replica_move)
                held = self.node.held(session)
                if owner is not None and held is not None and held[0] == owner.token:
                    continue  # served here already: a stale copy left in replicas/
                if owner is not None:  # taken over here, its promotion failed: again
                    token, previous = owner.token, "this node's earlier takeover"
                else:
                    current = replicas_of(self.client, session)
                    if current is None or self.node.name not in current.in_sync:
                        continue
                    failover = take_over(self.client, session, self.node.name,
                                         self.node.lease.lease_id)  # fmt: skip
                    token, previous = failover.token, failover.previous
            except ClusterError:
                continue  # etcd unreachable, or another follower won: look again later
            receiver_for(self.node.home).release(session)
            try:
                self._set_aside_unowned(session, token)
                promote(self.node.home, session)
            except SessionError as exc:
                self.report(f"cluster: {session}: taken over (token {token}) but its copy "
                            f"cannot be promoted: {exc}; tried again at the next scan")  # fmt: skip
                continue
            self.report(
                f"cluster: {session}: taken over from {previous} with token {token}: its "
                "copy is served here"
            )
            self.on_promoted(session, token)
            promoted.append(session)
        return promoted

    def adopt_unserved(self, skip: frozenset[str] = frozenset()) -> list[str]:
        """Serve each replicated session in ``sessions/`` that etcd names this node the
        owner of and that no claim here holds (a mover killed between ``promote`` and
        ``adopt``; a failover's claim that failed); the sessions handed to the daemon."""
        home = os.path.join(self.node.home, SESSIONS_DIR)
        names = sorted(os.listdir(home)) if os.path.isdir(home) else []
        adopted = []
        for session in names:
            if self._stop.is_set() or self.node.lease.stopping:
                break
            if session in skip or self.node.held(session) is not None:
                continue  # served here (an operator's stop included)
            try:
                owner = owner_of(self.client, session)
                if owner is None or owner.node != self.node.name:
                    continue  # its claim quarantines it, or a move is taking it here
                if self.client.get(move_key(session)) is not None:
                    continue
                if replicas_of(self.client, session) is None:
                    continue
            except (ClusterError, SessionError):
                continue  # etcd unreachable, or no session's name: look again later
            self.report(f"cluster: {session}: owned here (token {owner.token}) and served "
                        "by nobody: served here")  # fmt: skip
            self.on_promoted(session, owner.token)
            adopted.append(session)
        return adopted

    def _set_aside_unowned(self, session: str, token: int) -> None:
        """A ``sessions/<id>`` this node does not serve under etcd's token, beside the
        follower's copy it is taking over with: left from an earlier ownership (an old
        owner whose worker was never stopped, back), it lacks writes acknowledged since:
        quarantined, never served, never deleted (as a returning owner's is)."""
        if os.path.lexists(os.path.join(self.node.home, SESSIONS_DIR, session)):
            label = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            set_aside(self.node.home, session, QUARANTINE_DIR, f"{label}.not-owned")
            self.report(f"cluster: {session}: this node's copy in sessions/ is not the one "
                        f"etcd's token {token} was given for: quarantined")  # fmt: skip
