"""Failover in etcd: an in-sync follower takes the session over in one transaction.

Only once the owner's key is gone (its lease expired), only a follower in the in-sync
set as etcd holds it, only once; the new token is higher than the old, and the old
owner, a follower now, is out of sync and can change nothing with its old token.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import cast

import pytest

from supervisor.cluster.errors import MoveFailed, NotOwner
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.failover import take_over
from supervisor.cluster.failover_watch import FailoverWatch
from supervisor.cluster.keys import move_key
from supervisor.cluster.move import start_intent
from supervisor.cluster.node import Claims, ClusterNode
from supervisor.cluster.ownership import owner_of, place_new, placement_of
from supervisor.cluster.replica_move_node import promote_here
from supervisor.cluster.replica_set import ReplicaSet, change_in_sync, place_replicas, replicas_of
from tests.cluster_support import APP, create_session, register, send
from tests.etcd_server import EtcdServer
from tests.support import log_user_keys
from worker import Session
from worker.store.layout import SESSIONS_DIR
from worker.store.replica import Replica
from worker.store.replica_roles import replicas_root


def test_only_an_in_sync_follower_takes_over_and_only_once_the_owner_is_gone(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    with EtcdClient(etcd.url) as client:
        a, b, c = (register(client, name, tmp_path / name) for name in "abc")
        token = place_new(client, "r", "a", a.lease_id)
        place_replicas(client, "r", token, 3, ["b", "c"])
        with pytest.raises(NotOwner, match="not the owner's"):
            place_replicas(client, "r", token, 3, ["b", "c"])  # placed once
        change_in_sync(client, "r", token, remove="c")  # c fell behind
        with pytest.raises(NotOwner, match="owned by a"):
            take_over(client, "r", "b", b.lease_id)
        client.lease_revoke(a.lease_id)  # what the owner's lease expiring does
        with pytest.raises(NotOwner) as caught:
            take_over(client, "r", "c", c.lease_id)
        assert "c is not in its in-sync set ['b']" in str(caught.value)
        assert "\n" not in str(caught.value)
        failover = take_over(client, "r", "b", b.lease_id)
        assert failover.token > token
        assert failover.previous == "a"
        owner = owner_of(client, "r")
        assert owner is not None
        assert (owner.node, owner.token) == ("b", failover.token)
        assert placement_of(client, "r") == "b"
        assert replicas_of(client, "r") == ReplicaSet(3, ("c", "a"), (), failover.token)
        with pytest.raises(NotOwner, match="owned by b"):
            take_over(client, "r", "b", b.lease_id)
        with pytest.raises(NotOwner, match="no longer the owner's"):
            change_in_sync(client, "r", token, add="a")  # the old owner's token is void
        assert change_in_sync(client, "r", failover.token, add="c").in_sync == ("c",)


def test_a_replicated_session_is_not_moved(etcd: EtcdServer, tmp_path: Path) -> None:
    with EtcdClient(etcd.url) as client:
        a = register(client, "a", tmp_path / "a")
        register(client, "b", tmp_path / "b")
        token = place_new(client, "r", "a", a.lease_id)
        place_replicas(client, "r", token, 2, ["b"])
        with pytest.raises(MoveFailed) as caught:
            start_intent(client, "r", "b")
        assert "a replicated session is not moved by copying its files" in str(caught.value)
        assert client.get(move_key("r")) is None  # nothing was changed


def test_a_takeover_whose_promotion_failed_is_promoted_at_a_later_scan(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    """b takes r over while its copy is still held open (the receiver's step in flight):
    the promotion fails. b owns r in etcd, so no other node takes it over; b's next scan
    promotes it and serves it under the same token (found by ``loopd chaos cluster --seed
    2026 --replicas 3 --lease-ttl 2 --faults kill-owner-host``: r stayed unowned)."""
    with EtcdClient(etcd.url) as client:
        a, b = (register(client, name, tmp_path / name) for name in "ab")
        token = create_session(client, a, "r")
        place_replicas(client, "r", token, 2, ["b"])
        root = Path(replicas_root(b.home))
        shutil.copytree(a.home / SESSIONS_DIR / "r", root / SESSIONS_DIR / "r")
        held = Replica.open(str(root), "r")  # locked, as by the receiver
        client.lease_revoke(a.lease_id)  # what the owner's lease expiring does
        promoted: list[tuple[str, int]] = []
        reports: list[str] = []
        node = cast(ClusterNode, b)
        watch = FailoverWatch(client, node, 1.0, lambda s, t: promoted.append((s, t)),
                              reports.append)  # fmt: skip
        try:
            assert watch.scan() == []
            owner = owner_of(client, "r")
            assert owner is not None
            assert owner.node == "b"
            assert "taken over" in reports[0]
            assert "cannot be promoted" in reports[0]
        finally:
            held.close()
        assert watch.scan() == ["r"]
        assert promoted == [("r", owner.token)]
        assert (b.home / SESSIONS_DIR / "r").is_dir()
        assert not (root / SESSIONS_DIR / "r").exists()
        assert watch.scan() == []  # served now: nothing more to do


def test_a_stale_session_beside_the_copy_taken_over_is_quarantined_not_served(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    """b holds an old ``sessions/r`` (an earlier ownership's, never stopped) and an in-sync
    follower's copy with every write since: taking r over, b serves the follower's copy
    and sets the old one aside (it was skipped as served, and the old one claimed)."""
    with EtcdClient(etcd.url) as client:
        a, b = (register(client, name, tmp_path / name) for name in "ab")
        token = create_session(client, a, "r")
        place_replicas(client, "r", token, 2, ["b"])
        send(a.home, "r", "k0")
        shutil.copytree(a.home / SESSIONS_DIR / "r", b.home / SESSIONS_DIR / "r")  # stale
        send(a.home, "r", "k1")
        root = Path(replicas_root(b.home))
        shutil.copytree(a.home / SESSIONS_DIR / "r", root / SESSIONS_DIR / "r")
        client.lease_revoke(a.lease_id)
        promoted: list[tuple[str, int]] = []
        reports: list[str] = []
        watch = FailoverWatch(client, cast(ClusterNode, b), 1.0,
                              lambda s, t: promoted.append((s, t)), reports.append)  # fmt: skip
        assert watch.scan() + watch.scan() == ["r"]
        owner = owner_of(client, "r")
        assert owner is not None
        assert promoted == [("r", owner.token)]
        assert log_user_keys(b.home, "r") == ["k0", "k1"]
        (aside,) = (b.home / "quarantine").iterdir()
        assert aside.name.startswith("r.")
        assert aside.name.endswith(".not-owned")
        assert any("quarantined" in line for line in reports)


def test_a_node_restarted_between_takeover_and_promotion_serves_the_copy_taken_over(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    """b took r over from its follower's copy and was killed before promoting it, an old
    ``sessions/r`` beside it: its claim leaves r to the watch, which serves the copy."""
    with EtcdClient(etcd.url) as client, EtcdClient(etcd.url) as own:
        a = register(client, "a", tmp_path / "a")
        b = ClusterNode(own, "b", tmp_path / "b")
        b.start()
        try:
            token = create_session(client, a, "r")
            place_replicas(client, "r", token, 2, ["b"])
            send(a.home, "r", "k0")
            shutil.copytree(a.home / SESSIONS_DIR / "r", tmp_path / "b" / SESSIONS_DIR / "r")
            send(a.home, "r", "k1")
            root = Path(replicas_root(b.home))
            shutil.copytree(a.home / SESSIONS_DIR / "r", root / SESSIONS_DIR / "r")
            client.lease_revoke(a.lease_id)
            take_over(client, "r", "b", b.lease.lease_id)
            claims = b.claim_local_sessions()  # as at its restart
            assert "r" not in claims.served
            assert "follower's copy taken over" in claims.waiting["r"]
            watch = FailoverWatch(client, b, 1.0, lambda s, t: None, lambda line: None)
            assert watch.scan() == ["r"]
            assert log_user_keys(tmp_path / "b", "r") == ["k0", "k1"]
        finally:
            b.close()


def test_a_session_promoted_here_and_never_adopted_is_served_by_the_watch(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    """A replicated move's mover killed between ``promote`` and ``adopt``: b owns r in
    etcd and holds it in ``sessions/``, and serves it nowhere; its watch hands it over."""
    with EtcdClient(etcd.url) as client, EtcdClient(etcd.url) as own:
        a = register(client, "a", tmp_path / "a")
        b = ClusterNode(own, "b", tmp_path / "b")
        b.start()
        try:
            token = create_session(client, a, "r")
            place_replicas(client, "r", token, 2, ["b"])
            shutil.copytree(a.home / SESSIONS_DIR / "r", tmp_path / "b" / SESSIONS_DIR / "r")
            client.lease_revoke(a.lease_id)
            failover = take_over(client, "r", "b", b.lease.lease_id)  # as the move's `own`
            handed: list[tuple[str, int]] = []
            watch = FailoverWatch(client, b, 1.0, lambda s, t: handed.append((s, t)),
                                  lambda line: None)  # fmt: skip
            assert watch.scan() == []  # no follower's copy left to promote
            assert watch.adopt_unserved() == ["r"]
            assert handed == [("r", failover.token)]
            b.adopt("r", failover.token, b.lease.lease_id)  # what the daemon's claim does
            assert watch.adopt_unserved() == []  # served now
        finally:
            b.close()


class _PromotedMeanwhile:
    """b, whose ``held`` (the watch's last check before it promotes) lets a replicated
    move's ``promote`` step promote the same copy first, as its mover thread may."""

    def __init__(self, node: object, client: EtcdClient) -> None:
        self._node = node
        self._client = client
        self.promoted: list[dict[str, object]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._node, name)

    def held(self, session: str) -> tuple[int, int] | None:
        if not self.promoted:
            self.promoted.append(promote_here(self._client, "b", str(self.home), session))
        return None


def test_a_copy_a_move_promoted_during_the_watchs_scan_is_not_set_aside(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    """b owns r (a handover's ``own``) and its watch scans while the mover's ``promote``
    runs in another thread of b: the watch finds the copy promoted and leaves it be (it
    set the promoted ``sessions/r`` aside as stale: the move's ``adopt`` then found no
    session, and r stayed owned by b and served by nobody, in the CI's drain test)."""
    with EtcdClient(etcd.url) as client:
        a, b = (register(client, name, tmp_path / name) for name in "ab")
        token = create_session(client, a, "r")
        place_replicas(client, "r", token, 2, ["b"])
        send(a.home, "r", "k0")
        root = Path(replicas_root(b.home))
        shutil.copytree(a.home / SESSIONS_DIR / "r", root / SESSIONS_DIR / "r")
        client.lease_revoke(a.lease_id)
        take_over(client, "r", "b", b.lease_id)  # b owns r in etcd, as the move's `own`
        node = _PromotedMeanwhile(b, client)
        reports: list[str] = []
        watch = FailoverWatch(client, cast(ClusterNode, node), 1.0, lambda s, t: None,
                              reports.append)  # fmt: skip
        assert watch.scan() == []  # the move's adopt serves it, not the watch
        assert node.promoted == [{"session": "r", "promoted": True}]
        assert log_user_keys(b.home, "r") == ["k0"]
        assert not (b.home / "quarantine").exists(), reports
        assert not (root / SESSIONS_DIR / "r").exists()


def test_a_copy_taken_over_between_an_epochs_end_and_the_next_epoch_is_claimed(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    """The old owner died between its EpochEnd (shipped to the followers while it was
    written) and the next epoch's files: the copy taken over ends with EpochEnd. Its
    claim writes no Owner into the closed epoch and serves it (the worker completes the
    change with the recorded summary, then writes its Owner); before, the claim was
    refused at every scan ("epoch 0 is closed by EpochEnd") and the session never served
    again (found by the 100-kill `loopd chaos cluster --seed 2026 --replicas 3`)."""
    with EtcdClient(etcd.url) as client, EtcdClient(etcd.url) as own:
        a = register(client, "a", tmp_path / "a")
        b = ClusterNode(own, "b", tmp_path / "b")
        b.start()
        try:
            token = create_session(client, a, "r")
            place_replicas(client, "r", token, 2, ["b"])
            send(a.home, "r", "k0")
            with Session.open(a.home, "r") as opened:
                opened.commit_epoch("the summary", APP.next_baseline(opened, "the summary"))
            copy = tmp_path / "b" / SESSIONS_DIR / "r"
            shutil.copytree(a.home / SESSIONS_DIR / "r", copy)
            for name in ("1.jsonl", "1.baseline.json"):  # the next epoch never reached b
                (copy / name).unlink()
            client.lease_revoke(a.lease_id)
            failover = take_over(client, "r", "b", b.lease.lease_id)
            claims = Claims()
            b.claim("r", claims)
            assert claims.served == {"r": failover.token}, claims
            with Session.open(b.home, "r") as opened:  # nothing was written into it
                assert opened.epoch_closed
                assert opened.fence.token == token
        finally:
            b.close()
