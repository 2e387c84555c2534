"""A cluster node's side of ownership: register, keep the lease, claim or quarantine local copies.

At start (and after its lease was lost and renewed) a node looks at every session on
its disk: one placed on it and owned by nobody or by itself it claims, with a token it
writes into the log as ``Owner``; any other copy (placed elsewhere, owned by another
node, or holding a newer token than etcd gives it) is quarantined, never served
(docs/scaling.md section 5).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from supervisor.cluster.errors import NotOwner
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import move_key
from supervisor.cluster.lease import LeaseTiming, NodeLease
from supervisor.cluster.ownership import acquire, owner_of, place_new, placement_of
from supervisor.moves.session_files import QUARANTINE_DIR, set_aside
from supervisor.node.stored import placed_on
from worker import (
    Baseline,
    EpochClosed,
    NotOwnerNow,
    Owner,
    Session,
    SessionError,
    SessionLocked,
)
from worker.store.disk.layout import SESSIONS_DIR
from worker.store.fencing import write_owner

LEASE_FILE: Final = "cluster.lease"
"""``<home>/cluster.lease``: the lease deadline the node publishes to its workers."""


@dataclass(slots=True)
class Claims:
    """What a claim of the local sessions found: tokens served, copies quarantined, skipped."""

    served: dict[str, int] = field(default_factory=dict)
    quarantined: dict[str, str] = field(default_factory=dict)  # session -> why
    waiting: dict[str, str] = field(default_factory=dict)  # session -> why (e.g. a move)


class ClusterNode:
    """One node: its lease, its claims on the sessions of its home."""

    def __init__(
        self,
        client: EtcdClient,
        name: str,
        home: str | os.PathLike[str],
        *,
        timing: LeaseTiming | None = None,
        address: str | None = None,
        stored: bool = False,
    ) -> None:
        self.client = client
        # Its sessions are in a database (--store): claimed from etcd's placements, never
        # opened here; their workers open them with the token (supervisor.node.stored).
        self.stored = stored
        self.name = name
        self.home = os.fspath(home)
        # Where clients reach the node: its tls:// port, or its unix socket (one machine).
        self.address = address or f"unix:{os.path.join(self.home, 'loopd.sock')}"
        registration: dict[str, object] = {"address": self.address, "home": self.home}
        if stored:  # a move of its sessions copies no file (supervisor.moves.move_stored)
            registration["stored"] = True
        self.lease = NodeLease(
            client,
            name,
            registration,
            timing=timing,
            deadline_path=os.path.join(self.home, LEASE_FILE),
            on_new_lease=self._lease_renewed,
        )
        self._lock = threading.Lock()
        # session -> (token, the lease it was claimed under)
        self.tokens: dict[str, tuple[int, int]] = {}
        self.on_reclaimed: Callable[[Claims], None] | None = None  # after a new lease's claims

    def start(self) -> Claims:
        """Register, start the keepalive, and claim the sessions on this node's disk."""
        Path(self.home).mkdir(parents=True, exist_ok=True)
        self.lease.register()
        self.lease.start()
        return self.claim_local_sessions()

    def close(self) -> None:
        """Stop the keepalive and revoke the lease: this node owns nothing any more."""
        self.lease.close()

    def can_acknowledge(self, session: str, token: int) -> bool:
        """True if a write to ``session`` under ``token`` may be acknowledged now."""
        # The clock first, then the lease id: a lease renewed in between (new id) refuses.
        proven = self.lease.clock.can_acknowledge()
        with self._lock:
            held = self.tokens.get(session)
        return proven and held == (token, self.lease.lease_id)

    def token_of(self, session: str) -> int | None:
        """The token this node serves ``session`` with, or None if it does not serve it."""
        held = self.held(session)
        return None if held is None else held[0]

    def held(self, session: str) -> tuple[int, int] | None:
        """The token this node serves ``session`` with and the lease it was given under."""
        with self._lock:
            return self.tokens.get(session)

    def held_sessions(self) -> list[str]:
        """The sessions this node serves now."""
        with self._lock:
            return sorted(self.tokens)

    def create(self, session: str, baseline: Baseline, slot: int = 0) -> int:
        """Create a session on this node: placed and owned in etcd first, then on disk."""
        lease = self.lease.lease_id
        token = place_new(self.client, session, self.name, lease)
        with Session.create(self.home, session, baseline, slot=slot) as created:
            created.append(Owner(node=self.name, token=token))
        if not self.adopt(session, token, lease):
            raise NotOwner(session, "created, but the node's lease changed meanwhile")
        return token

    def adopt(self, session: str, token: int, lease: int) -> bool:
        """Serve ``session`` with ``token`` given under ``lease`` (just placed here; its worker
        writes the Owner); False if the node's lease changed meanwhile (the token is void)."""
        with self._lock:
            if lease != self.lease.lease_id:
                return False
            self.tokens[session] = (token, lease)
        return True

    def claim_local_sessions(self) -> Claims:
        """Claim or quarantine every session directory in this node's home."""
        claims = Claims()
        sessions = os.path.join(self.home, SESSIONS_DIR)
        if self.stored:
            names = placed_on(self.client, self.name)
        else:
            names = sorted(os.listdir(sessions)) if os.path.isdir(sessions) else []
        for session in names:
            if self.lease.stopping:
                break  # the node is closing: its claims end with its lease
            self.claim(session, claims)
        return claims

    def claim(self, session: str, claims: Claims) -> None:
        """Claim one local session (token into its log) or quarantine it; record which."""
        if self.stored:
            self._claim_stored(session, claims)
            return
        lease = self.lease.lease_id  # the token is given under this one
        placed = placement_of(self.client, session)
        owner = owner_of(self.client, session)
        moving = self.client.get(move_key(session))
        if (
            moving is not None
            and placed == self.name
            and (owner is None or owner.node != self.name)
        ):
            # The source of a move (sealed), or its target before it owns the session.
            claims.waiting[session] = "a move is in progress"
            return
        if placed != self.name or (owner is not None and owner.node != self.name):
            holder = owner.node if owner is not None else placed
            self._quarantine(session, claims, f"placed on {placed}, owned by {holder}")
            return
        if owner is not None:
            token = owner.token
        else:
            try:
                token = acquire(self.client, session, self.name, lease)
            except NotOwner as exc:
                claims.waiting[session] = exc.why
                return
        try:
            with Session.open(self.home, session) as opened:
                write_owner(opened, self.name, token)
        except NotOwnerNow as exc:
            self._quarantine(session, claims, exc.why)
            return
        except SessionLocked:
            pass  # its worker runs: restarted with this token, it writes the Owner itself
        except EpochClosed:
            # An epoch change cut short (its EpochEnd written, the next epoch's files not:
            # the owner died between them); no newer token is in the log. The worker
            # completes the change with the recorded summary, then writes its Owner.
            pass
        except SessionError as exc:
            claims.waiting[session] = str(exc)
            return
        if not self.adopt(session, token, lease):
            claims.waiting[session] = "the node's lease changed meanwhile"
            return
        claims.served[session] = token

    def _claim_stored(self, session: str, claims: Claims) -> None:
        """Claim a session in the database placed on this node: etcd's owner key only (its
        worker opens it with the token); nothing here to quarantine if it is another's."""
        lease = self.lease.lease_id
        placed = placement_of(self.client, session)
        owner = owner_of(self.client, session)
        if placed != self.name or (owner is not None and owner.node != self.name):
            with self._lock:
                self.tokens.pop(session, None)
            holder = owner.node if owner is not None else placed
            claims.waiting[session] = f"placed on {placed}, owned by {holder}"
            return
        if owner is not None:
            token = owner.token
        else:
            try:
                token = acquire(self.client, session, self.name, lease)
            except NotOwner as exc:  # a move in progress, or placed elsewhere meanwhile
                claims.waiting[session] = exc.why
                return
        if not self.adopt(session, token, lease):
            claims.waiting[session] = "the node's lease changed meanwhile"
            return
        claims.served[session] = token

    def _quarantine(self, session: str, claims: Claims, why: str) -> None:
        label = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        set_aside(self.home, session, QUARANTINE_DIR, label)
        with self._lock:
            self.tokens.pop(session, None)
        claims.quarantined[session] = why

    def _lease_renewed(self, lease: int) -> None:
        """The old lease expired: every claim is void until made again under the new one."""
        with self._lock:
            self.tokens.clear()
        claims = self.claim_local_sessions()
        if self.on_reclaimed is not None:
            self.on_reclaimed(claims)
