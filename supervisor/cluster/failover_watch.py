"""Automatic failover: a follower node watches the owners of the sessions it follows.

A thread of the node looks at each copy in ``<home>/replicas/sessions/`` as soon as an
owner key is deleted (an etcd watch of ``/loopd/owner/``: a lease expired with its
node), and at least every ``interval`` seconds (a third of the lease TTL) whatever
happened: when etcd names no owner of the session
(the owner's lease expired with its node) and this node is in the session's in-sync
set, it takes the session over (``failover.take_over``: one transaction, a higher
token), closes the copy the TLS gateway holds open, promotes it
(``worker.store.replica_roles.promote``) and hands it to the daemon, which claims it
(``Owner{me, T'}`` into its log) and starts its worker, shipping to the followers left.
Of two in-sync followers the one whose copy ends further takes over (the other leaves
it to it for up to ``failover_rank.DEFER_FOR`` s); of two equal ones the first to try
wins, and the other finds an owner.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Final

from supervisor.cluster.errors import ClusterError
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.failover import take_over
from supervisor.cluster.failover_rank import DEFER_FOR, copy_end, further_follower
from supervisor.cluster.keys import PREFIX, move_key
from supervisor.cluster.node import ClusterNode
from supervisor.cluster.ownership import owner_of
from supervisor.cluster.replica_receiver import receiver_for
from supervisor.cluster.replica_set import ReplicaSet, replicas_of
from supervisor.cluster.session_files import QUARANTINE_DIR, set_aside
from supervisor.cluster.transport import TlsFiles
from worker.store.errors import SessionError
from worker.store.layout import SESSIONS_DIR, session_dir
from worker.store.replica_roles import promote, replicas_root

OWNERS = f"{PREFIX}owner/"
WATCH_SLICE: Final = 1.0  # seconds of one watch call
RECHECK: Final = 0.1  # seconds to the next scan while a takeover is left to another


class FailoverWatch:
    """The thread that takes over the sessions whose owner is gone, when this node may."""

    def __init__(
        self,
        client: EtcdClient,
        node: ClusterNode,
        interval: float,
        on_promoted: Callable[[str, int], None],
        report: Callable[[str], None],
        tls: TlsFiles | None = None,
    ) -> None:
        self.client = client
        self.tls = tls  # the node's certificate: other followers' positions are asked
        self.node = node
        self.interval = interval
        self.on_promoted = on_promoted  # (session, token): called in this thread
        self.report = report
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._deferred: dict[str, float] = {}  # session -> when a further follower was found
        self._woken: float | None = None  # when the last deletion of an owner key was seen

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="loopd-failover", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            since = self._revision()
            promoted = self.scan()
            self.adopt_unserved(skip=frozenset(promoted))
            if self._deferred:  # soon again: the further follower took over, or not
                self._stop.wait(RECHECK)
            else:
                self._wait(since)

    def _defer(self, session: str, current: ReplicaSet) -> bool:
        """True while another in-sync follower's copy ends further than this node's (for
        at most ``DEFER_FOR`` s from the first time it was found so): it takes over."""
        first = self._deferred.get(session)
        if first is not None and time.monotonic() - first >= DEFER_FOR:
            return False
        mine = copy_end(self.node.home, session)
        further = further_follower(current, self.node.name, session, mine, self.tls)
        if further is None:
            return False
        if first is None:
            self._deferred[session] = time.monotonic()
            self.report(f"cluster: {session}: its takeover left to {further}, whose copy "
                        "is further")  # fmt: skip
        return True

    def _timing(self) -> str:
        """When, on the CLOCK_MONOTONIC every process of the machine shares (a chaos run's
        clients' too): the deletion seen, and now (the copy promoted)."""
        now = time.monotonic()
        seen = "" if self._woken is None else f"an owner key's deletion seen at {self._woken:.3f}, "
        return f" ({seen}promoted at {now:.3f}, CLOCK_MONOTONIC)"

    def _revision(self) -> int | None:
        """etcd's revision now (None: unreachable): the watch starts after it."""
        try:
            return self.client.txn([], []).revision
        except ClusterError:
            return None

    def _wait(self, since: int | None) -> None:
        """Until an owner key is deleted after revision ``since`` (a lease expired with its
        node: the next scan takes over at once), at most ``interval`` s: the scan runs
        then anyway (a deletion missed, a takeover whose promotion failed)."""
        deadline = time.monotonic() + self.interval
        start = None if since is None else since + 1
        while start is not None and not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:  # in slices: a close never waits for more than one
                events = self.client.watch(
                    OWNERS, start_revision=start, prefix=True, wait=min(left, WATCH_SLICE)
                )
            except ClusterError:
                break
            if any(event.kind == "DELETE" for event in events):
                self._woken = time.monotonic()
                return
            if events:  # an owner written (a takeover, a claim): watch on after it
                start = max(event.kv.mod_revision for event in events) + 1
        self._stop.wait(max(0.0, deadline - time.monotonic()))

    def scan(self) -> list[str]:
        """Take over every followed session that has no owner and names this node in
        sync; the sessions promoted here. A copy etcd already names this node the owner
        of (its promotion failed, e.g. the copy was still locked by the receiver) is
        promoted again: no other node may take it over while this one holds it."""
        copies = os.path.join(replicas_root(self.node.home), SESSIONS_DIR)
        names = sorted(os.listdir(copies)) if os.path.isdir(copies) else []
        for gone in set(self._deferred) - set(names):
            del self._deferred[gone]  # its copy left (promoted elsewhere, removed)
        promoted = []
        for session in names:
            if self._stop.is_set() or self.node.lease.stopping:
                break
            try:
                owner = owner_of(self.client, session)
                if owner is not None:
                    self._deferred.pop(session, None)
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
                    if self._defer(session, current):
                        continue  # a further in-sync follower takes it over (failover_rank)
                    failover = take_over(self.client, session, self.node.name,
                                         self.node.lease.lease_id)  # fmt: skip
                    token, previous = failover.token, failover.previous
            except ClusterError:
                continue  # etcd unreachable, or another follower won: look again later
            if not self._promote(session, token):
                continue
            self.report(
                f"cluster: {session}: taken over from {previous} with token {token}: its "
                f"copy is served here{self._timing()}"
            )
            self.on_promoted(session, token)
            promoted.append(session)
        return promoted

    def _promote(self, session: str, token: int) -> bool:
        """Promote the follower's copy of ``session``; False if it is no longer there (a
        move's ``promote`` step was first: its ``adopt`` serves it, nothing is set aside)
        or cannot be promoted (reported; the next scan tries again)."""
        receiver = receiver_for(self.node.home)
        with receiver.promotion:
            if not os.path.isdir(session_dir(replicas_root(self.node.home), session)):
                return False
            receiver.release(session)
            try:
                self._set_aside_unowned(session, token)
                promote(self.node.home, session)
            except SessionError as exc:
                self.report(f"cluster: {session}: taken over (token {token}) but its copy "
                            f"cannot be promoted: {exc}; tried again at the next scan")  # fmt: skip
                return False
        return True

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
