"""The owner's shipper against followers' receivers on real files, in one process.

The case a failover leaves: the old owner died while shipping a group, so one
follower's copy holds a group the new owner's log does not. The new owner's catch-up
finds the prefix they share and has the follower cut its copy back to it (the suffix
to quarantine, never deleted); then it ships on and the copy is its log byte for byte.
"""

from __future__ import annotations

import threading
import zlib
from pathlib import Path

import pytest

from supervisor.cluster.replica_receiver import ReplicaReceiver
from tests.support import log_user_keys, poll_until
from worker import Assistant, Baseline, Owner, Session, User
from worker.catch_up import ShipFailed
from worker.follower_tls import parse_line_ends
from worker.replication import Shipper
from worker.store.fencing import write_owner
from worker.store.loader import load_session
from worker.store.replica_roles import promote, replicas_root
from worker.store.replica_source import tail_step
from worker.store.replica_types import Position, Step
from worker.wire import Message

BASELINE = Baseline(system="s", memory="m", tools=[])
T = "2026-12-01T18:00:00.000000Z"


class LocalFollower:
    """A ``FollowerChannel`` that hands each request to a receiver directly."""

    def __init__(self, node: str, home: Path) -> None:
        self.node = node
        self.receiver = ReplicaReceiver(str(home))

    def _ask(self, request: Message) -> dict[str, object]:
        reply = self.receiver.handle({"id": 1, **request})
        if reply.get("ok") is not True:
            raise ShipFailed(f"{self.node}: {reply.get('error')}")
        result = reply.get("result")
        assert isinstance(result, dict)
        return result

    def ship(self, step: Step) -> Position:
        position = Position.from_message(
            self._ask({"op": "replicate", "step": step.to_message()})["position"]
        )
        assert position is not None
        return position

    def position(self, session: str) -> Position | None:
        return Position.from_message(
            self._ask({"op": "replica_position", "session": session})["position"]
        )

    def line_ends(self, session: str, epoch: int) -> tuple[int, list[list[int]]]:
        return parse_line_ends(
            self.node, self._ask({"op": "replica_line_ends", "session": session, "epoch": epoch})
        )

    def rewind(self, session: str, keep: Position, token: int) -> Position:
        request = {
            "op": "replica_rewind",
            "session": session,
            "position": keep.to_message(),
            "token": token,
        }
        position = Position.from_message(self._ask(request)["position"])
        assert position is not None
        return position


def _write(session: Session, key: str) -> None:
    session.append_many([User(time=T, text=key, key=key), Assistant(time=T, text=f"a {key}")])


def test_a_follower_ahead_of_the_new_owner_is_cut_back_and_caught_up(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    changes: list[tuple[str, bool]] = []
    to_b, to_c = LocalFollower("b", b), LocalFollower("c", c)
    with Session.create(a, "s", BASELINE) as old:
        old.append(Owner(node="a", token=5))
        shipper = Shipper(
            old, 5, 3, [to_b, to_c], ["b", "c"], lambda n, ok: changes.append((n, ok))
        )
        shipper.start()
        _write(old, "k1")
        assert shipper.ship() is None  # on both followers: acknowledged
        held = Path(old.log_path).read_bytes()
        _write(old, "k2")  # the owner dies while shipping it: only c got it
        end = Position(old.epoch, Path(old.log_path).stat().st_size, 0)
        shipper.close()
    (step,) = tail_step(a, "s", Position(0, len(held), zlib.crc32(held)), end, 5)
    to_c.ship(step)
    assert log_user_keys(Path(replicas_root(c)), "s") == ["k1", "k2"]
    # b takes over with token 9 (etcd's part: tests/test_cluster_failover.py).
    to_b.receiver.release("s")
    promote(b, "s")
    with Session.open(b, "s") as new:
        write_owner(new, "b", 9)
        successor = Shipper(new, 9, 3, [to_c], ["c"], lambda n, ok: changes.append((n, ok)))
        successor.start()
        assert successor.in_sync == {"c"}
        assert any("cut back" in why for _node, why in successor.lost)
        _write(new, "k3")
        assert successor.ship() is None
        successor.close()
    copy = Path(replicas_root(c), "sessions", "s")
    load_session(str(copy), "s", history=True)
    assert (copy / "0.jsonl").read_bytes() == (b / "sessions" / "s" / "0.jsonl").read_bytes()
    assert log_user_keys(Path(replicas_root(c)), "s") == ["k1", "k3"]
    quarantined = b"".join(
        p.read_bytes() for p in Path(replicas_root(c), "quarantine", "s").iterdir()
    )
    assert b'"key":"k2"' in quarantined
    assert changes == []  # nobody fell out of sync
    to_c.receiver.close()


def test_a_rewind_with_a_lower_token_is_refused(tmp_path: Path) -> None:
    a, c = tmp_path / "a", tmp_path / "c"
    to_c = LocalFollower("c", c)
    with Session.create(a, "s", BASELINE) as owner:
        owner.append(Owner(node="a", token=5))
        shipper = Shipper(owner, 5, 2, [to_c], ["c"], lambda n, ok: None)
        shipper.start()
        _write(owner, "k1")
        assert shipper.ship() is None
        shipper.close()
    at = to_c.position("s")
    assert at is not None
    reply = to_c.receiver.handle(
        {"id": 1, "op": "replica_rewind", "session": "s", "position": [0, 10, 0], "token": 4}
    )
    assert reply["ok"] is False
    assert reply["error"]["code"] == "stale_token"  # type: ignore[index]
    assert to_c.position("s") == at
    to_c.receiver.close()


def test_a_new_follower_is_caught_up_a_slice_at_a_time_while_writes_go_on(
    tmp_path: Path,
) -> None:
    """A copy added to a large session (a move to a new node) is shipped a slice per call
    between batches, not all at once before the next write: the session takes writes,
    acknowledged by the follower in sync, while the new copy grows; once it ends at the
    owner's position it is added back, and the copy is the owner's log byte for byte."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    changes: list[tuple[str, bool]] = []
    to_b, to_c = LocalFollower("b", b), LocalFollower("c", c)
    with Session.create(a, "s", BASELINE) as owner:
        owner.append(Owner(node="a", token=5))
        for i in range(120):  # about 1 MB: several pieces of at most 256 KiB
            owner.append_many([User(time=T, text="x" * 8000, key=f"big{i}")])
        shipper = Shipper(owner, 5, 3, [to_b, to_c], ["b"], lambda n, ok: changes.append((n, ok)))
        shipper.start()  # b, in sync, is caught up whole before the first write
        assert shipper.in_sync == {"b"}
        sizes: list[int] = []
        joined: list[str] = []
        for i in range(50):
            joined = shipper.rejoin(["c"], budget=0.0)  # one piece a call
            if joined:
                break
            at = to_c.position("s")
            assert at is not None
            sizes.append(at.size)
            (row,) = (r for r in shipper.report()["followers"] if r["node"] == "c")  # type: ignore[attr-defined]
            assert row["copy_at"] == at.to_message()  # what a mover reads to see it grow
            _write(owner, f"w{i}")  # a write meanwhile, acknowledged without c
            assert shipper.ship() is None
        assert joined == ["c"]
        assert len(sizes) >= 4
        assert sizes == sorted(sizes)
        assert len(set(sizes)) == len(sizes)  # it grew at every call
        assert changes == [("c", True)]
        _write(owner, "after")
        assert shipper.ship() is None  # c is shipped to now
        shipper.close()
        log = Path(owner.log_path).read_bytes()
    assert (Path(replicas_root(c)) / "sessions" / "s" / "0.jsonl").read_bytes() == log
    keys = log_user_keys(Path(replicas_root(c)), "s")
    assert keys[-1] == "after"
    assert len(keys) == 120 + len(sizes) + 1
    to_b.receiver.close()
    to_c.receiver.close()


class Stalling(LocalFollower):
    """A follower whose ``replicate`` hangs while ``stall`` is set (SIGSTOPped, or cut off
    without a refusal), until ``go`` is set; ``timed_out`` if nobody set it in 10 s."""

    def __init__(self, node: str, home: Path) -> None:
        super().__init__(node, home)
        self.stall = False
        self.stalled = threading.Event()
        self.go = threading.Event()
        self.timed_out = False

    def ship(self, step: Step) -> Position:
        if self.stall:
            self.stalled.set()
            self.timed_out = not self.go.wait(10)
            self.stall = False
        return super().ship(step)


def test_a_follower_that_stops_answering_while_it_is_caught_up_holds_up_no_write(
    tmp_path: Path,
) -> None:
    """The catch-up runs off the worker's thread: while the follower being caught up
    does not answer, the worker's calls between batches return and its writes are
    acknowledged by the follower in sync; once it answers again it is caught up and
    added back (before, the worker's thread waited out the link's timeout)."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    to_b, to_c = LocalFollower("b", b), Stalling("c", c)
    with Session.create(a, "s", BASELINE) as owner:
        owner.append(Owner(node="a", token=5))
        for i in range(20):
            owner.append_many([User(time=T, text="x" * 100_000, key=f"big{i}")])
        shipper = Shipper(owner, 5, 3, [to_b, to_c], ["b"], lambda _n, _ok: None)
        shipper.start()
        to_c.stall = True
        assert shipper.rejoin_answering() == []  # its task starts: the worker goes on
        poll_until(to_c.stalled.is_set, what="c's catch-up to hang")
        for i in range(5):  # the worker's batches meanwhile
            _write(owner, f"w{i}")
            assert shipper.ship() is None
            assert shipper.rejoin_answering() == []
        to_c.go.set()
        poll_until(lambda: shipper.rejoin_answering() == ["c"], what="c added back")
        assert not to_c.timed_out  # nothing waited for c on the worker's thread
        _write(owner, "after")
        assert shipper.ship() is None
        shipper.close()
        log = Path(owner.log_path).read_bytes()
    assert (Path(replicas_root(c)) / "sessions" / "s" / "0.jsonl").read_bytes() == log
    to_b.receiver.close()
    to_c.receiver.close()


def test_a_catch_up_crosses_epoch_commits_one_step_at_a_time(tmp_path: Path) -> None:
    """A copy caught up from nothing over two epoch commits, one step a call, with a
    commit between two calls: each epoch's log and baseline on the copy are the owner's."""
    a, c = tmp_path / "a", tmp_path / "c"
    to_c = LocalFollower("c", c)
    with Session.create(a, "s", BASELINE) as owner:
        owner.append(Owner(node="a", token=5))
        for i in range(6):
            owner.append_many([User(time=T, text="y" * 100_000, key=f"e0-{i}")])
        owner.commit_epoch("first", BASELINE)
        _write(owner, "e1")
        shipper = Shipper(owner, 5, 2, [to_c], [], lambda _n, _ok: None, required=1)
        assert shipper.rejoin(["c"], budget=0.0) == []  # epoch 0's first step only
        owner.commit_epoch("second", BASELINE)  # between two calls
        _write(owner, "e2")
        joined: list[str] = []
        for _ in range(30):
            if joined := shipper.rejoin(["c"], budget=0.0):
                break
        assert joined == ["c"]
        shipper.close()
    copy = Path(replicas_root(c)) / "sessions" / "s"
    for name in ("0.jsonl", "1.jsonl", "2.jsonl", "1.baseline.json", "2.baseline.json", "0-1.keys"):
        assert (copy / name).read_bytes() == (a / "sessions" / "s" / name).read_bytes(), name
    load_session(str(copy), "s", history=True)
    to_c.receiver.close()


def test_a_catch_up_whose_read_of_the_log_fails_leaves_the_follower_out_and_tries_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An OSError reading the owner's own log during a catch-up (a disk error) keeps the
    follower out of sync for this call; it never ends the worker's thread."""
    a, c = tmp_path / "a", tmp_path / "c"
    to_c = LocalFollower("c", c)
    with Session.create(a, "s", BASELINE) as owner:
        owner.append(Owner(node="a", token=5))
        _write(owner, "k1")
        shipper = Shipper(owner, 5, 2, [to_c], [], lambda _n, _ok: None, required=1)

        def unreadable(*_args: object) -> None:
            raise OSError(5, "Input/output error", owner.log_path)

        with monkeypatch.context() as patched:
            patched.setattr("worker.catch_up.next_step", unreadable)
            assert shipper.rejoin(["c"]) == []
        assert shipper.in_sync == set()
        assert shipper.rejoin(["c"]) == ["c"]  # the disk reads again: caught up
        shipper.close()
    to_c.receiver.close()
