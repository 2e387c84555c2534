"""A group shipped while the owner's own fdatasync runs: what stays true.

The owner hands each group to its followers right after its write, before its
fdatasync (``Session.on_written``, ``Shipper.written``); the reply still waits for
both. So: a follower may hold a group the owner never synced (the owner SIGKILLed
between its write and its fdatasync, and its host losing what was not synced): the
owner back with that log cuts the follower back to the prefix they share, the group to
quarantine; followers that do not answer get no acknowledgement counted for them
(both SIGSTOPped: the write is answered as not acknowledged, and etcd's in-sync set is
empty before that answer); a follower failing on a group handed over is out of etcd's
in-sync set before ``ship`` returns; groups handed over reach each follower in the
order of the log, and an epoch commit's files (read back from the log) after them.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.support import log_user_keys, poll_until, stopped
from tests.test_cluster_replication import SESSION, Replicated, cluster
from tests.test_replication_lag_report import Flaky
from tests.test_replication_shipper import BASELINE, LocalFollower, _write
from worker import Owner, Session
from worker.lease_deadline import write_deadline
from worker.replica_fence import ReplicatedFence
from worker.replication import Shipper
from worker.store.errors import NotOwnerNow
from worker.store.fencing import write_owner
from worker.store.loader import load_session
from worker.store.replica_roles import replicas_root

__all__ = ["cluster"]  # the fixture, from the real-process tests of replication
pytestmark = pytest.mark.timeout(90)


def test_a_group_a_follower_took_before_the_owner_synced_it_is_cut_back_when_lost(
    cluster: Replicated,
) -> None:
    token = cluster.start_owner(replicas=3)["token"]
    assert isinstance(token, int)
    for key in ("k1", "k2"):
        assert cluster.ask(f"send {key}")["ok"] is True
    owner_log = cluster.root / "a" / "sessions" / SESSION / "0.jsonl"
    synced = owner_log.stat().st_size
    # SIGKILLed after its write of k3, before its fdatasync, once both followers took it.
    assert cluster.owner is not None
    assert cluster.owner.stdin is not None
    cluster.owner.stdin.write("crash k3\n")
    cluster.owner.stdin.flush()
    assert cluster.owner.wait(timeout=60) == -signal.SIGKILL
    cluster.kill_owner()
    for name in ("b", "c"):
        assert cluster.copy_keys(name) == ["k1", "k2", "k3"]  # ahead of any acknowledgement
    for daemon in cluster.followers.values():
        daemon.stop()
    os.truncate(owner_log, synced)  # its host lost what was never synced (a power cut)
    # The owner back (a higher token) with that log: each follower is cut back to the
    # prefix they share before any write, k3 kept in its quarantine.
    followers = [LocalFollower(name, cluster.root / name) for name in ("b", "c")]
    changes: list[tuple[str, bool]] = []
    with Session.open(cluster.root / "a", SESSION) as owner:
        write_owner(owner, "a", token + 1)
        shipper = Shipper(owner, token + 1, 3, followers, ["b", "c"],
                          lambda node, ok: changes.append((node, ok)))  # fmt: skip
        owner.on_written = shipper.written
        shipper.start()
        assert shipper.in_sync == {"b", "c"}
        assert sorted(node for node, why in shipper.lost if "cut back" in why) == ["b", "c"]
        _write(owner, "k4")
        assert shipper.ship() is None
        shipper.close()
    assert changes == []
    for follower in followers:
        follower.receiver.close()
        copies = Path(replicas_root(cluster.root / follower.node))
        load_session(str(copies / "sessions" / SESSION), SESSION, history=True)
        assert log_user_keys(copies, SESSION) == ["k1", "k2", "k4"]
        assert (copies / "sessions" / SESSION / "0.jsonl").read_bytes() == owner_log.read_bytes()
        quarantined = b"".join(p.read_bytes() for p in (copies / "quarantine" / SESSION).iterdir())
        assert b'"key":"k3"' in quarantined


def test_no_write_is_acknowledged_by_followers_that_took_it_and_never_answered(
    cluster: Replicated,
) -> None:
    cluster.start_owner(replicas=3)
    assert cluster.ask("send k1")["ok"] is True
    # The connections stay up: the sends are taken, never answered.
    with stopped(*(cluster.followers[name].proc for name in ("b", "c"))):
        reply = cluster.ask("send k2")
        in_sync = cluster.replica_set()
    assert reply["ok"] is False, reply
    assert "did not acknowledge" in str(reply["error"])
    assert in_sync is not None
    assert in_sync.in_sync == ()
    owner_keys = log_user_keys(cluster.root / "a", SESSION)
    assert owner_keys == ["k1", "k2"]  # durable on the owner, not acknowledged


def test_a_follower_failing_on_a_group_handed_over_is_out_of_etcd_before_ship_returns(
    tmp_path: Path,
) -> None:
    b, c = Flaky("b", tmp_path / "b"), LocalFollower("c", tmp_path / "c")
    changes: list[tuple[str, bool]] = []
    with Session.create(tmp_path / "a", "s", BASELINE) as owner:
        owner.append(Owner(node="a", token=5))
        shipper = Shipper(owner, 5, 3, [b, c], ["b", "c"], lambda n, ok: changes.append((n, ok)))
        owner.on_written = shipper.written
        shipper.start()
        _write(owner, "k1")
        assert shipper.ship() is None
        b.down = True
        _write(owner, "k2")  # handed to both lanes at its write; b fails there
        _write(owner, "k3")  # queued behind it on b's lane: not sent to b at all
        assert changes == []  # nothing is decided before ship collects the answers
        assert shipper.ship() is None  # c acknowledged both; a majority is in sync
        assert changes == [("b", False)]
        assert shipper.in_sync == {"c"}
        assert any("b: no answer" in why for node, why in shipper.lost if node == "b")
        shipper.close()
    assert log_user_keys(Path(replicas_root(tmp_path / "b")), "s") == ["k1"]
    assert log_user_keys(Path(replicas_root(tmp_path / "c")), "s") == ["k1", "k2", "k3"]
    for follower in (b, c):
        follower.receiver.close()


def test_groups_handed_over_arrive_in_log_order_and_an_epoch_commit_follows(
    tmp_path: Path,
) -> None:
    b, c = LocalFollower("b", tmp_path / "b"), LocalFollower("c", tmp_path / "c")
    with Session.create(tmp_path / "a", "s", BASELINE) as owner:
        owner.append(Owner(node="a", token=5))
        shipper = Shipper(owner, 5, 3, [b, c], ["b", "c"], lambda n, ok: None)
        owner.on_written = shipper.written
        shipper.start()
        for n in range(5):  # several groups before one ship: one chunk of a worker
            _write(owner, f"k{n}")
        assert shipper.ship() is None
        owner.commit_epoch("summary", BASELINE)  # its EpochEnd handed over, its files read
        _write(owner, "k5")
        assert shipper.ship() is None
        shipper.close()
        logs = {p.name: p.read_bytes() for p in Path(owner.dir).glob("*.jsonl")}
    for follower in (b, c):
        follower.receiver.close()
        copies = Path(replicas_root(tmp_path / follower.node))
        load_session(str(copies / "sessions" / "s"), "s", history=True)
        assert log_user_keys(copies, "s") == [f"k{n}" for n in range(6)]
        for name, data in logs.items():
            assert (copies / "sessions" / "s" / name).read_bytes() == data


def test_the_worker_hands_a_group_over_only_while_its_lease_is_proven(tmp_path: Path) -> None:
    lease_file = tmp_path / "lease"
    fd = os.open(lease_file, os.O_RDWR | os.O_CREAT, 0o600)
    b = LocalFollower("b", tmp_path / "b")
    try:
        write_deadline(fd, time.monotonic() + 60, str(lease_file), lease=7)
        with Session.create(tmp_path / "a", "s", BASELINE) as owner:
            owner.append(Owner(node="a", token=5))
            shipper = Shipper(owner, 5, 2, [b], ["b"], lambda n, ok: None)
            fence = ReplicatedFence(str(lease_file), 7, 5, shipper, str(tmp_path / "none.sock"))
            owner.on_written = fence.written
            shipper.start()
            copy = Path(replicas_root(tmp_path / "b"))
            _write(owner, "k1")  # proven: sent to b at the write, before any check after it
            poll_until(lambda: log_user_keys(copy, "s") == ["k1"], what="k1 on b")
            fence.check()
            write_deadline(fd, time.monotonic() - 1, str(lease_file), lease=7)
            _write(owner, "k2")  # the lease ran out: nothing leaves the owner
            with pytest.raises(NotOwnerNow):
                fence.check()  # and the check after the fsync refuses it before shipping
            fence.close()  # its lanes' sends done
            assert log_user_keys(copy, "s") == ["k1"]
    finally:
        os.close(fd)
        b.receiver.close()
