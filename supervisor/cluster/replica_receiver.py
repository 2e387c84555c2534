"""A follower node's side of replication: the owner's steps applied to its copies.

The node's TLS gateway answers ``replicate`` and ``replica_position`` from a node
certificate itself (in a thread, like a moved session's ``files``): each step is
applied to the copy in ``<home>/replicas/sessions/<id>`` (``worker.store.replica``),
which checks it whole, its token against the highest it has seen, and fdatasyncs it
before the reply, the follower's acknowledgement. One step at a time on a node (a
lock), so two senders (an owner and a deposed one) never interleave on a copy.
"""

from __future__ import annotations

import os
import threading
from typing import Final

from worker.store.errors import SessionError, SessionNotFound
from worker.store.layout import session_dir
from worker.store.replica import Replica
from worker.store.replica_roles import line_ends, replicas_root, rewind
from worker.store.replica_types import NotContinuing, Position, ReplicaRefused, StaleToken, Step
from worker.wire import Message, WireError, error, field, ok

OPS: Final = frozenset({"replicate", "replica_position", "replica_line_ends", "replica_rewind"})
WRITES: Final = frozenset({"replicate", "replica_rewind"})
"""The ops that change a copy: only from the session's owner (``replica_sender``)."""
_RECEIVERS: dict[str, ReplicaReceiver] = {}
_RECEIVERS_LOCK = threading.Lock()


def receiver_for(home: str) -> ReplicaReceiver:
    """The one receiver of a node's home in this process: the TLS gateway writes copies
    with it, the failover (``supervisor/cluster/failover_watch.py``) releases one with it."""
    with _RECEIVERS_LOCK:
        receiver = _RECEIVERS.get(home)
        if receiver is None:
            receiver = _RECEIVERS[home] = ReplicaReceiver(home)
        return receiver


class ReplicaReceiver:
    """The copies a follower node holds open, and the requests that write them."""

    def __init__(self, home: str) -> None:
        self.root = replicas_root(home)
        self._copies: dict[str, Replica] = {}
        self._released: set[str] = set()  # promoted here: no step is written to them
        self._lock = threading.Lock()
        # Held around a promotion (the failover watch's, a move's ``promote`` step): the
        # one that comes second finds the copy promoted, and sets nothing aside.
        self.promotion = threading.Lock()
        # Set once the node's claim pass is done (``claimed``): until then a returning old
        # owner's copy may still be in sessions/, not yet a follower's in replicas/.
        self._claimed = threading.Event()
        self._claimed.set()  # held only by a node's gateway, from before its claims

    def close(self) -> None:
        with self._lock:
            for replica in self._copies.values():
                replica.close()
            self._copies.clear()

    def release(self, session: str) -> None:
        """Close the copy of ``session`` (its lock released): it is being promoted. Until
        then no step is applied to it; a step after it reopens whatever is there."""
        with self._lock:
            self._released.add(session)
            replica = self._copies.pop(session, None)
            if replica is not None:
                replica.close()

    def resume(self, session: str) -> None:
        """The copy of ``session`` is a follower's again (its owner moved away, or its old
        owner demoted here): steps are applied to it from now on."""
        with self._lock:
            self._released.discard(session)

    def hold(self) -> None:
        """Answer every request ``unavailable`` until ``claimed`` (a node starting)."""
        self._claimed.clear()

    def claimed(self) -> None:
        """The node's claims are made: its copies are where they belong."""
        self._claimed.set()

    def handle(self, message: Message) -> Message:
        """Answer one ``replicate`` or ``replica_position`` request (one-line errors)."""
        request_id = message.get("id")
        at: Position | None
        if not self._claimed.is_set():
            return error(request_id, "unavailable", "the node is claiming its sessions: "
                         "its copies take no step before it is done")  # fmt: skip
        try:
            with self._lock:
                op = message.get("op")
                if op in ("replica_line_ends", "replica_rewind"):
                    return ok(request_id, self._diverged(message))
                if op == "replicate":
                    step = Step.from_message(message.get("step"))
                    replica = self._copy(step.session, step)
                    if replica is None:  # made by this very step (epoch 0)
                        replica = self._copies[step.session]
                        at = replica.position
                    else:
                        at = replica.apply(step)
                else:
                    session = message.get("session")
                    if not isinstance(session, str):
                        raise ValueError("field 'session' must be a string")
                    replica = self._copy(session, None)
                    at = replica.position if replica is not None else None
        except (ValueError, WireError) as exc:
            return error(request_id, "bad_request", str(exc))
        except StaleToken as exc:
            return error(request_id, "stale_token", str(exc))
        except NotContinuing as exc:
            return error(request_id, "not_continuing", str(exc))
        except ReplicaRefused as exc:
            return error(request_id, "refused", str(exc))
        except SessionError as exc:
            self._forget(message)
            return error(request_id, "replica_failed", str(exc))
        except OSError as exc:  # a path of the replicas home that is not what it must be
            self._forget(message)
            where = exc.filename if exc.filename is not None else self.root
            return error(request_id, "replica_failed", f"{where}: {exc.strerror or exc}")
        return ok(request_id, {"position": None if at is None else at.to_message()})

    def _diverged(self, message: Message) -> dict[str, object]:
        """``replica_line_ends``: the copy's line ends in an epoch (the new owner finds the
        prefix they share); ``replica_rewind``: the copy cut back to that prefix, by an
        owner whose token is no lower than the copy has seen (``replica_roles.rewind``)."""
        session = field(message, "session", str)
        replica = self._copy(session, None)
        if replica is None:
            raise NotContinuing(self.root, f"no copy of {session} here")
        if message.get("op") == "replica_line_ends":
            epoch = message.get("epoch")
            if type(epoch) is not int or epoch < 0:
                raise ValueError("field 'epoch' must be an integer >= 0")
            found, ends = line_ends(self.root, session, min(epoch, replica.position.epoch))
            return {"epoch": found, "ends": ends}
        keep, token = Position.from_message(message.get("position")), message.get("token")
        if keep is None or type(token) is not int:
            raise ValueError("fields 'position' and 'token' are needed")
        if token < replica.highest_token:
            raise StaleToken(self.root, f"token {token} is lower than {replica.highest_token}")
        replica.close()
        del self._copies[session]
        moved = rewind(self.root, session, keep)
        replica = self._copy(session, None)
        assert replica is not None
        return {"position": replica.position.to_message(), "quarantined": moved}

    def _copy(self, session: str, step: Step | None) -> Replica | None:
        """The open copy of ``session``, or None: there is none, or ``step`` (epoch 0) made it."""
        replica = self._copies.get(session)
        if replica is not None:
            return replica
        if session in self._released:
            raise NotContinuing(self.root, f"{session} was promoted here: it is served, not copied")
        try:
            replica = Replica.open(self.root, session)
        except SessionNotFound as exc:
            directory = session_dir(self.root, session)
            if os.path.lexists(directory) and not os.path.isdir(directory):
                raise ReplicaRefused(directory, "is not a directory: not a copy") from exc
            if step is None or step.epoch != 0 or not step.is_epoch:
                if step is not None:
                    raise NotContinuing(self.root, f"no copy of {session} here") from None
                return None
            self._copies[session] = Replica.create(self.root, step)
            return None
        self._copies[session] = replica
        return replica

    def _forget(self, message: Message) -> None:
        """A copy that failed (a write or fsync error) is closed: the next step reopens it."""
        step = message.get("step")
        session = step.get("session") if isinstance(step, dict) else message.get("session")
        replica = self._copies.pop(session, None) if isinstance(session, str) else None
        if replica is not None:
            replica.close()
