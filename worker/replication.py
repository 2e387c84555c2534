"""The owner's side of a replicated session: each commit shipped to the in-sync followers.

The worker writes a group commit and, while its own fdatasync runs, hands the bytes
it wrote (``Shipper.written``, the session's ``on_written``) to every in-sync follower
at once, its thread writing each one's connection (``worker.ship_lanes``); after the fdatasync
``Shipper.ship`` sends what was not handed over (an epoch commit's files, read back
from the log: ``worker.store.replica_source``) and waits for each one's
acknowledgement (its copy written and fdatasynced, ``worker.store.replica``). Only
when the owner's fdatasync returned and every follower acknowledged may the owner
answer the client. A follower that fails, or answers a position other than the owner's, is
removed from the in-sync set (``change_in_sync``: the node's etcd transaction guarded
by the owner's token, done before ``ship`` returns) and the chunk is answered as not
acknowledged; while fewer copies are in sync than the session asks for, every write is
refused before a byte of it is written (``check_writable``).

The worker imports nothing of the supervisor: the channels to the followers and the
etcd change are handed to it (``FollowerChannel``, ``change_in_sync``) by whoever
starts it.

What the owner knows of each follower is reported too (``Shipper.report``, carried to
the daemon with the worker's state reports): how far its last acknowledgement is behind
the owner's durable log end, in bytes and in group commits, and how long ago it was.
"""

from __future__ import annotations

import collections
import os
import time
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final

from worker.catch_up import CATCH_UP_SLICE, CatchUps, FollowerChannel, ShipFailed
from worker.ship_lanes import Lanes
from worker.store.errors import NotOwnerNow, SessionError
from worker.store.replica_source import split_step, tail_step
from worker.store.replica_types import Position, Step
from worker.store.session import Session
from worker.wire import REPLICA_MAX_FRAME

MAX_STEP: Final = 256 * 1024  # bytes of lines per shipped step (a wire frame holds 1 MiB)
MAX_WRITE: Final = REPLICA_MAX_FRAME - (64 << 10)
"""Bytes one group commit of a replicated session may be: a group is never cut, so it is
one step, and its ``replicate`` (the bytes and its fields) must fit one replication
frame. A larger write is refused before a byte of it is written (``Session.max_write``);
before this bound it was written, never taken by any follower, and every write after it
refused until they caught up, which they never could."""
FRESH: Final = 2.0
"""Seconds a catch-up task's end counts for the rejoin that follows it."""
LOST_KEPT: Final = 100
"""Entries ``Shipper.lost`` keeps (a session refusing writes for hours adds one a batch)."""
PROBE_INTERVAL: Final = 0.25
"""Seconds from a catch-up task that failed (its follower did not answer) to the next."""


class ReplicasMissing(NotOwnerNow):
    """Fewer copies are in sync than the session asks for: writes are refused (or a write
    was not acknowledged by every in-sync follower). A ``NotOwnerNow``: the worker
    answers it as it answers an unproven lease, before or after the write."""

    def __init__(self, session: str, why: str) -> None:
        super().__init__(session, why)
        self.session = session

    def __str__(self) -> str:
        return f"session {self.session}: {self.why}"


InSyncChange = Callable[[str, bool], None]
"""``change(node, in_sync)``: remove (False) or add (True) a follower in etcd; raises if
the change could not be made (then the owner acknowledges nothing without it)."""


def majority(replicas: int) -> int:
    """The copies that must be in sync for a write of a session of ``replicas`` copies."""
    return replicas // 2 + 1


class Shipper:
    """Ships one owner session's commits to its followers and keeps its in-sync set.

    ``required`` (a majority of ``replicas`` by default) is how many copies, the owner's
    included, must be in sync for any write to be taken.
    """

    def __init__(
        self,
        session: Session,
        token: int,
        replicas: int,
        followers: Iterable[FollowerChannel],
        in_sync: Iterable[str],
        change_in_sync: InSyncChange,
        required: int | None = None,
    ) -> None:
        self.session = session
        session.max_write = MAX_WRITE
        self.token = token
        self.replicas = replicas
        self.required = majority(replicas) if required is None else required
        self.followers = {channel.node: channel for channel in followers}
        self.in_sync = set(in_sync) & set(self.followers)
        # Out of the worker's set, but their removal from etcd's not confirmed yet: no
        # write is acknowledged until it is (etcd's set may lag behind, never lead).
        self.unconfirmed: set[str] = set()
        self._change = change_in_sync
        self._home = os.path.dirname(os.path.dirname(session.dir))
        self._lanes = Lanes(self.followers)  # each follower's sends and their answers
        self._shipped = False  # steps queued since the last ship
        # A follower out of sync is caught up off the worker's thread: one that does not
        # answer (stopped, cut off) never holds up the writes.
        self._probes: dict[str, Future[float]] = {}  # node -> its catch-up task
        self._probe_pool = ThreadPoolExecutor(max_workers=max(1, len(self.followers)))
        self._probed: dict[str, float] = {}  # node -> when its last probe was sent
        self._at = self._own_position()
        # (node, why) of the latest followers removed or cut back: the newest LOST_KEPT
        self.lost: collections.deque[tuple[str, str]] = collections.deque(maxlen=LOST_KEPT)
        self._catching = CatchUps(self._home, session.id, token, MAX_STEP, self.lost)
        # For the report: bytes and group commits shipped (or, to nobody, written) since
        # this worker started, and each follower's count at its last acknowledgement.
        self._bytes = 0
        self._groups = 0
        self._acked: dict[str, tuple[int, int, float]] = {}  # node -> (bytes, groups, when)
        self.in_sync_changes = 0  # followers taken out of or back into etcd's in-sync set
        self.writes_refused = 0  # batches refused before a byte, too few copies in sync

    def close(self) -> None:
        self.session.max_write = None
        self._lanes.close()
        self._probe_pool.shutdown(wait=False, cancel_futures=True)

    def _own_position(self) -> Position:
        size = crc = 0
        with open(self.session.log_path, "rb") as log:
            while chunk := log.read(1 << 20):  # in chunks: memory stays bounded
                size, crc = size + len(chunk), zlib.crc32(chunk, crc)
        return Position(self.session.epoch, size, crc)

    # -- before and after a write ---------------------------------------------------------

    def check_writable(self) -> None:
        """Refuse a write (before a byte is written) while too few copies are in sync, or
        while a follower's removal from etcd's in-sync set is not confirmed."""
        for node in sorted(self.unconfirmed):
            self._confirm_removal(node)
        if self.unconfirmed:
            self.writes_refused += 1
            raise ReplicasMissing(
                self.session.id,
                f"follower {', '.join(sorted(self.unconfirmed))} is not in sync and etcd "
                "could not be told: writes are refused until it is",
            )
        copies = 1 + len(self.in_sync)
        if copies < self.required:
            self.writes_refused += 1
            out = sorted(set(self.followers) - self.in_sync)
            raise ReplicasMissing(
                self.session.id,
                f"{copies} of its {self.replicas} copies are in sync, {self.required} are "
                f"needed (not in sync: {', '.join(out)}): writes are refused until they "
                "catch up",
            )

    def written(self, epoch: int, offset: int, prior_crc: int, data: bytes) -> None:
        """``Session.on_written``: send the group just written to every in-sync follower,
        before the owner's own fdatasync (``ship``, after it, reads the answers).

        Only a group that continues what was shipped last is handed over; anything else
        (after an epoch commit) ``ship`` reads from the log, as it reads what follows.
        """
        at = self._at
        if not data or (epoch, offset, prior_crc) != (at.epoch, at.size, at.crc):
            return
        try:
            self._queue([Step(self.session.id, epoch, offset, prior_crc, data, self.token)])
        except Exception:  # noqa: BLE001 - never into the store's write: ship sends it
            return  # from the log (a follower that took part of it holds a resend as is)

    def _queue(self, steps: list[Step]) -> None:
        pieces = [piece for step in steps for piece in split_step(step, MAX_STEP)]
        if not pieces:
            return
        expected = pieces[-1].end
        for node in sorted(self.in_sync):
            self._lanes.send(node, pieces)
        self._at = expected
        self._bytes += sum(len(piece.data) for piece in pieces)
        self._shipped = True

    def ship(self) -> ReplicasMissing | None:
        """Ship what the owner wrote since the last call to every in-sync follower, and
        wait for every follower's answer to it (and to what ``written`` handed over).

        Returns None when every in-sync follower acknowledged, those that failed having
        first been removed from etcd's in-sync set, and enough copies are left in sync;
        otherwise the error to answer the written requests with (durable here, not
        acknowledged).
        """
        at = self._at
        newest = Position(self.session.epoch, os.stat(self.session.log_path).st_size, 0)
        if (newest.epoch, newest.size) != (at.epoch, at.size):
            self._queue(tail_step(self._home, self.session.id, at, newest, self.token))
        if not self._shipped:
            return None
        self._shipped = False
        results = self._lanes.collect()
        self._groups += 1
        failed = [(node, why) for node, why in sorted(results.items()) if why]
        for node, why in results.items():
            if why is None:
                self._acked_now(node)
        for node, why in failed:
            self._drop(node, why)
        if not failed:
            return None
        if not self.unconfirmed and 1 + len(self.in_sync) >= self.required:
            return None  # acknowledged by every follower still in sync, in etcd too
        names = ", ".join(node for node, _why in failed)
        return ReplicasMissing(
            self.session.id,
            f"follower {names} did not acknowledge ({failed[0][1]}); the write is durable "
            f"on the owner but not acknowledged ({1 + len(self.in_sync)} of "
            f"{self.required} copies needed are in sync)",
        )

    def _drop(self, node: str, why: str) -> None:
        self.in_sync.discard(node)  # first: whatever etcd says, nothing is acked without it
        self.lost.append((node, why))
        self.unconfirmed.add(node)
        self._confirm_removal(node)

    def _confirm_removal(self, node: str) -> None:
        """Remove ``node`` from etcd's in-sync set; it stays unconfirmed if that fails."""
        try:
            self._change(node, False)
        except Exception as exc:  # noqa: BLE001 - any failure: nothing acked without it
            self.lost.append((node, f"not removed from etcd's in-sync set: {exc}"))
        else:
            self.unconfirmed.discard(node)
            self.in_sync_changes += 1

    # -- catching up ----------------------------------------------------------------------

    def start(self) -> None:
        """Before the first write: every in-sync follower must hold the owner's log."""
        for node in sorted(self.in_sync):
            why = self._catch_up(node)
            if why is not None:
                self._drop(node, why)

    def rejoin_answering(self, budget: float = CATCH_UP_SLICE) -> list[str]:
        """Catch the followers out of sync up off this thread, and add back those that
        are: the worker's call between batches never waits on a follower that does not
        answer (SIGSTOPped, cut off) while the session takes writes (``worker.catch_up``).

        Each follower out of sync gets a task (on the shipper's pool) that asks its
        position and ships what follows, until nothing whole is left; once it has ended,
        here, the steps written since are shipped for at most ``budget`` seconds and the
        follower is added back if its copy then ends where this log ends; otherwise a new
        task goes on. A task that failed is tried again ``PROBE_INTERVAL`` later."""
        ready = []
        for node in sorted(set(self.followers) - self.in_sync - self.unconfirmed):
            task = self._probes.get(node)
            if task is not None and not task.done():
                continue
            if task is not None:
                del self._probes[node]
                if task.exception() is None and time.monotonic() - task.result() < FRESH:
                    ready.append(node)  # it answered just now: the rest on this thread
                    continue
                self._probed[node] = time.monotonic() + PROBE_INTERVAL
            if time.monotonic() >= self._probed.get(node, 0.0):
                self._probes[node] = self._probe_pool.submit(self._run_catch_up, node)
        return self.rejoin(ready, budget) if ready else []

    def _run_catch_up(self, node: str) -> float:
        """A catch-up task: ``node`` shipped what this log holds whole; when it ended."""
        self._catching.run(self.followers[node], None)
        return time.monotonic()

    def progressed(self) -> bool:
        """True once after a follower being caught up acknowledged a step (the worker
        then reports its state: the owner's status says where the copy ends)."""
        progressed, self._catching.progressed = self._catching.progressed, False
        return progressed

    def rejoin(self, nodes: Iterable[str] | None = None, budget: float | None = None) -> list[str]:
        """Catch up every follower out of sync (of ``nodes``, if given) and add it back;
        the nodes that rejoined. ``budget``: seconds of shipping to each (the rest at the
        next call, ``worker.catch_up``); None: until it is caught up or fails.

        Called between batches (nothing is being written): a follower whose copy ends
        at the owner's position is added to the in-sync set in etcd, and from the next
        write on it is shipped to before any acknowledgement.
        """
        joined = []
        out = set(self.followers) - self.in_sync - self.unconfirmed
        for node in sorted(out if nodes is None else out & set(nodes)):
            if self._catch_up(node, budget) is None:
                try:
                    self._change(node, True)
                except Exception as exc:  # noqa: BLE001 - it stays out; the next call retries
                    self.lost.append((node, f"could not be added back: {exc}"))
                    continue
                self.in_sync.add(node)
                self.in_sync_changes += 1
                joined.append(node)
        return joined

    def _catch_up(self, node: str, budget: float | None = None) -> str | None:
        """Ship ``node`` what its copy lacks (for at most ``budget`` seconds); None once
        its copy ends at the owner's position, else why not (yet)."""
        try:
            at = self._catching.run(self.followers[node], budget)
        except (ShipFailed, SessionError, OSError) as exc:  # OSError: this log unreadable
            return str(exc)
        if at is None:
            return "being caught up"  # steps left for the next call
        size = os.stat(self.session.log_path).st_size
        if (at.epoch, at.size) != (self.session.epoch, size):  # written meanwhile
            return f"its copy is at {at}, the owner's log ends at {self.session.epoch}:{size}"
        self._at = at  # its CRC-32 is this log's: each step's end was checked
        self._catching.forget(node)
        self._acked_now(node)
        return None

    # -- the report -----------------------------------------------------------------------

    def _acked_now(self, node: str) -> None:
        """``node``'s copy ends where the owner's durable log ends, as of now."""
        self._acked[node] = (self._bytes, self._groups, time.monotonic())

    def report(self) -> dict[str, object]:
        """Each follower's lag as the owner sees it, and the counters (wire-ready).

        ``lag_bytes`` and ``lag_groups``: what the owner made durable since the
        follower's last acknowledgement (0 for one in sync after each write);
        ``ack_age_s``: seconds since that acknowledgement. None for a follower that
        has not acknowledged anything since this worker started.
        """
        now = time.monotonic()
        followers: list[dict[str, object]] = []
        for node in sorted(self.followers):
            acked = self._acked.get(node)
            followers.append({
                "node": node,
                "in_sync": node in self.in_sync,
                "lag_bytes": None if acked is None else self._bytes - acked[0],
                "lag_groups": None if acked is None else self._groups - acked[1],
                "ack_age_s": None if acked is None else round(now - acked[2], 3),
                "copy_at": _message(self._catching.copy_at(node)),  # being caught up
            })  # fmt: skip
        return {
            "followers": followers,
            "in_sync_changes": self.in_sync_changes,
            "writes_refused": self.writes_refused,
        }


def _message(position: Position | None) -> object:
    return None if position is None else position.to_message()
