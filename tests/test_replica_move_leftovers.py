"""What a killed replicated move leaves behind, finished or cleared by a rerun, checked on
a real etcd with the nodes' own step functions on real homes (docs/scaling.md 9.5)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from supervisor.cluster.drain import drain_node
from supervisor.cluster.errors import ClusterError, MoveFailed
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.etcd_types import Put
from supervisor.cluster.keys import (
    encode_value,
    move_key,
    node_key,
    node_value,
    owner_key,
    placement_key,
)
from supervisor.cluster.move import MoveIntent
from supervisor.cluster.ownership import owner_of
from supervisor.cluster.replica_drain import drain_replicas
from supervisor.cluster.replica_grow import move_follower
from supervisor.cluster.replica_move import move_replicated, moved_key
from supervisor.cluster.replica_move_node import promote_here, unfollow_here
from supervisor.cluster.replica_receiver import receiver_for
from supervisor.cluster.replica_set import ReplicaSet, change_in_sync, replicas_key, replicas_of
from supervisor.cluster.serving import ServingNode
from supervisor.cluster.transport import Role
from supervisor.daemon.cluster_node import DaemonNode
from supervisor.daemon.endpoints import Waiter
from tests.etcd_server import EtcdServer
from tests.support import loopd
from tests.tls_certs import Certificates

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("leftovers") / "etcd")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def etcd(etcd_server: EtcdServer) -> Iterator[EtcdClient]:
    """A client of the module's etcd, every key of an earlier test gone."""
    with EtcdClient(etcd_server.url) as client:
        client.delete("/", prefix=True)
        yield client


class NodeSteps:
    """A mover's calls to nodes a, b, c, d, each made by that node's own step function on
    its home (``promote``), or recorded (every other step)."""

    def __init__(self, client: EtcdClient, root: Path, unreachable: str = "") -> None:
        self.client = client
        self.unreachable = unreachable  # a node no call reaches (a partition)
        self.homes = {name: root / name for name in "abcd"}
        self.made: list[tuple[str, str]] = []
        for name, home in self.homes.items():
            home.mkdir()
            value = encode_value({"address": f"tls://127.0.0.1:{1000 + ord(name)}",
                                  "home": str(home)})  # fmt: skip
            client.put(node_key(name), value)

    def __call__(self, node: str, op: str, session: str) -> object:
        if node == self.unreachable:
            raise ClusterError(f"node {node}: connection timed out")
        self.made.append((node, op))
        if op == "promote":
            return promote_here(self.client, node, str(self.homes[node]), session)
        return None


def test_a_handover_left_unfinished_then_failed_over_elsewhere_is_cleared_not_promoted(
    etcd: EtcdClient, tmp_path: Path
) -> None:
    """Mover killed after ``own`` (a to b), then b lost and c took over: a rerun's leftover
    ``/loopd/moved/r`` names b, which owns nothing; it is cleared, and b not promoted."""
    steps = NodeSteps(etcd, tmp_path)
    intent = MoveIntent(session="r", source="a", target="b", token=6,
                        source_home=str(steps.homes["a"]), target_home=str(steps.homes["b"]),
                        replicated=True)  # fmt: skip
    etcd.put(moved_key("r"), intent.encode())
    etcd.put(owner_key("r"), node_value("c"))
    etcd.put(placement_key("r"), node_value("c"))
    etcd.put(replicas_key("r"), ReplicaSet(3, ("a", "d"), ("a", "d")).value())
    done = move_replicated(etcd, "r", "c", steps)  # c owns it: nothing but the leftover
    assert done.node == "c"
    assert etcd.get(moved_key("r")) is None
    assert ("b", "promote") not in steps.made
    assert ("b", "adopt") not in steps.made
    assert ("a", "demote") in steps.made  # the old owner's step is still made (etcd-checked)


def test_a_leftover_whose_target_still_owns_it_is_promoted_there(
    etcd: EtcdClient, tmp_path: Path
) -> None:
    steps = NodeSteps(etcd, tmp_path)
    intent = MoveIntent(session="r", source="a", target="b", token=6,
                        source_home=str(steps.homes["a"]), target_home=str(steps.homes["b"]),
                        replicated=True)  # fmt: skip
    etcd.put(moved_key("r"), intent.encode())
    etcd.txn([], [Put(key=owner_key("r"), value=node_value("b")),
                  Put(key=placement_key("r"), value=node_value("b"))])  # fmt: skip
    etcd.put(replicas_key("r"), ReplicaSet(3, ("a", "c"), ("a", "c")).value())
    (steps.homes["b"] / "sessions" / "r").mkdir(parents=True)  # promoted by its watch already
    move_replicated(etcd, "r", "b", steps)
    assert ("b", "promote") in steps.made
    assert ("b", "adopt") in steps.made
    assert etcd.get(moved_key("r")) is None


def test_an_old_owner_the_mover_cannot_reach_keeps_the_session_while_its_lease_lives(
    etcd: EtcdClient, tmp_path: Path
) -> None:
    """A partition of the mover from the old owner only: its stop and ping fail, but its
    lease is alive (it may be serving): nothing is handed over, in one line."""
    steps = NodeSteps(etcd, tmp_path, unreachable="a")
    lease = etcd.lease_grant(60)
    token = etcd.put(owner_key("r"), node_value("a"), lease=lease.id)
    etcd.put(placement_key("r"), node_value("a"))
    etcd.put(replicas_key("r"), ReplicaSet(3, ("b", "c"), ("b", "c")).value())
    with pytest.raises(MoveFailed, match="a did not answer and still owns it in etcd"):
        move_replicated(etcd, "r", "b", steps, sync_timeout=1.0)
    owner = owner_of(etcd, "r")
    assert owner is not None
    assert (owner.node, owner.token) == ("a", token)
    assert etcd.get(moved_key("r")) is None
    assert etcd.get(move_key("r")) is not None  # a rerun goes on, or --abort undoes it
    assert ("b", "promote") not in steps.made
    etcd.lease_revoke(lease.id)  # its node is gone now: the rerun hands it over
    (steps.homes["b"] / "sessions" / "r").mkdir(parents=True)
    done = move_replicated(etcd, "r", "b", steps, sync_timeout=1.0)
    assert done.node == "b"
    current = replicas_of(etcd, "r")
    assert current is not None
    assert "a" in current.followers
    assert "a" not in current.in_sync  # its copy was never stopped nor demoted


@pytest.mark.parametrize(
    ("args", "wrong"),
    [
        (["move", "bad/id", "--to", "b"], "invalid session id 'bad/id'"),
        (["move", "r", "--follower", "c", "--to", "bad name"], "invalid node name 'bad name'"),
        (["drain", "bad name"], "invalid node name 'bad name'"),
    ],
)
def test_a_bad_session_id_or_node_name_is_one_line(args: list[str], wrong: str) -> None:
    done = loopd(*args, "--cluster", "http://127.0.0.1:9")  # refused before etcd is asked
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"Error: {wrong}: may only hold the characters "
                                        "A-Z a-z 0-9 . _ -"]  # fmt: skip


class _Replies:
    """A worker's end of its daemon connection: the replies it got."""

    def __init__(self) -> None:
        self.got: list[dict[str, object]] = []

    def reply(self, message: dict[str, object]) -> None:
        self.got.append(message)

    def reply_relayed(self, message: dict[str, object]) -> None:
        self.got.append(message)

    def reply_with_fd(self, message: dict[str, object], fd: int) -> bool:
        raise AssertionError("no descriptor is handed over here")


class _Serving:
    """The daemon's cluster side as far as an ``in_sync`` request goes: etcd's in-sync set
    changed under the session's token (``replica_set.change_in_sync``, on a real etcd)."""

    def __init__(self, client: EtcdClient, token: int) -> None:
        self.client = client
        self.token = token
        self.node = SimpleNamespace(on_reclaimed=None, lease=SimpleNamespace(on_problem=None))

    def change_in_sync(self, session: str, node: str, in_sync: bool) -> None:
        change_in_sync(self.client, session, self.token, add=node if in_sync else None)


def test_an_in_sync_request_for_a_node_no_longer_a_follower_is_answered_an_error(
    etcd: EtcdClient,
) -> None:
    """The worker's rejoin of a follower a move took out meanwhile: answered at once."""
    token = etcd.put(owner_key("r"), node_value("a"))
    etcd.put(replicas_key("r"), ReplicaSet(3, ("b", "c"), ("b",)).value())
    loop = asyncio.new_event_loop()
    serving = cast(ServingNode, _Serving(etcd, token))
    daemon = DaemonNode(loop, serving, {}, lambda line: None, lambda: False, lambda: None)
    replies = _Replies()
    try:
        daemon.in_sync_change(Waiter(replies, 7), "r", "d", True)  # d left the set
        deadline = time.monotonic() + 5

        async def answered() -> None:
            while not replies.got and time.monotonic() < deadline:
                await asyncio.sleep(0.01)

        loop.run_until_complete(answered())
    finally:
        daemon._executor.shutdown(wait=True)
        loop.close()
    (reply,) = replies.got
    assert reply["ok"] is False
    assert reply["error"] == {"code": "not_follower",
                              "message": "r: in-sync set not changed for d: d is not a "
                              "follower of r"}  # fmt: skip


def test_a_node_that_promoted_a_session_and_handed_it_on_may_follow_it_again(
    etcd: EtcdClient, tmp_path: Path
) -> None:
    """b promoted r (its receiver released it), then r moved on to d with b's copy
    dropped (``unfollow``): b's receiver takes r's copy again when r comes back."""
    home = tmp_path / "b"
    (home / "sessions").mkdir(parents=True)
    receiver = receiver_for(str(home))
    receiver.release("r")  # as promote_here and the failover watch do
    etcd.put(owner_key("r"), node_value("d"))
    etcd.put(placement_key("r"), node_value("d"))
    etcd.put(replicas_key("r"), ReplicaSet(3, ("a", "c"), ("a", "c")).value())
    assert unfollow_here(etcd, "b", str(home), "r") == {"session": "r", "unfollowed": False}
    reply = receiver.handle({"id": 1, "op": "replica_position", "session": "r"})
    assert reply["ok"] is True, reply


def test_a_follower_move_rerun_after_shrink_restarts_the_owner_worker_without_it(
    etcd: EtcdClient, tmp_path: Path
) -> None:
    """Killed after shrink's transaction (c out of the set, d in sync): the rerun has the
    owner's worker restarted with etcd's followers, and c's copy set aside."""
    steps = NodeSteps(etcd, tmp_path)
    etcd.put(owner_key("r"), node_value("a"))
    etcd.put(placement_key("r"), node_value("a"))
    etcd.put(replicas_key("r"), ReplicaSet(3, ("b", "d"), ("b", "d")).value())
    done = move_follower(etcd, "r", "c", "d", steps)
    assert done.followers == ("b", "d")
    assert steps.made == [("a", "refollow"), ("c", "unfollow")]


def _one_copy_more(etcd: EtcdClient) -> None:
    """r on a with followers b, c and d in sync: a killed run's grow added one."""
    etcd.put(owner_key("r"), node_value("a"))
    etcd.put(placement_key("r"), node_value("a"))
    etcd.put(replicas_key("r"), ReplicaSet(3, ("b", "c", "d"), ("b", "c", "d")).value())


def test_a_move_rerun_after_its_grow_leaves_the_copies_the_session_asks_for(
    etcd: EtcdClient, tmp_path: Path
) -> None:
    steps = NodeSteps(etcd, tmp_path)
    _one_copy_more(etcd)
    (steps.homes["d"] / "sessions" / "r").mkdir(parents=True)  # d's promotion, made
    assert move_replicated(etcd, "r", "d", steps).node == "d"
    current = replicas_of(etcd, "r")
    assert current is not None
    assert (current.followers, current.in_sync) == (("b", "c"), ("b", "c"))
    assert ("a", "demote") not in steps.made
    assert ("a", "unfollow") in steps.made


def test_a_drain_rerun_after_its_grow_uses_the_copy_it_added(
    etcd: EtcdClient, tmp_path: Path
) -> None:
    steps = NodeSteps(etcd, tmp_path)
    _one_copy_more(etcd)
    for name in "bcd":
        (steps.homes[name] / "sessions" / "r").mkdir(parents=True)
    drained = drain_replicas(etcd, "a", ["r"], steps)
    assert drained.refused == []
    owner = owner_of(etcd, "r")
    assert owner is not None
    current = replicas_of(etcd, "r")
    assert current is not None
    assert len(current.followers) == 2
    assert "a" not in (owner.node, *current.followers)


def test_a_drain_of_an_unregistered_node_says_which_copies_stay(
    etcd: EtcdClient, tmp_path: Path
) -> None:
    """e is dead (not registered): the copies it follows are not moved, each in one line."""
    NodeSteps(etcd, tmp_path)  # a, b, c and d registered
    etcd.put(owner_key("r"), node_value("a"))
    etcd.put(placement_key("r"), node_value("a"))
    etcd.put(replicas_key("r"), ReplicaSet(3, ("b", "e"), ("b", "e")).value())
    drained = drain_node(etcd, "e")
    assert drained.refused == [
        "session r: its copy on e stays (a replicated session's copies are moved between "
        "tls:// nodes only, and e is not registered at one): loopd move r --follower e --to NODE"
    ]


def test_a_replicated_session_is_not_moved_to_an_unregistered_node_by_its_files(
    etcd: EtcdClient, tmp_path: Path
) -> None:
    NodeSteps(etcd, tmp_path)
    etcd.put(owner_key("r"), node_value("a"))
    etcd.put(placement_key("r"), node_value("a"))
    etcd.put(replicas_key("r"), ReplicaSet(3, ("b", "c"), ("b", "c")).value())
    done = loopd("move", "r", "--to", "e", "--cluster", etcd.url)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "Error: session r is replicated: it moves between tls:// nodes only, and e is not "
        "registered at a tls:// address (is it running?)"
    ]
    assert etcd.get(move_key("r")) is None


class _CountedLock:
    """A lock that counts how often it was taken."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.taken = 0

    def __enter__(self) -> None:
        self.lock.acquire()
        self.taken += 1

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_a_refollow_reads_the_replica_set_under_the_in_sync_lock(
    etcd: EtcdClient, etcd_server: EtcdServer, tmp_path: Path
) -> None:
    """refollow and a worker's in-sync change both write the node's view of the set: one
    at a time (refollow's could be overwritten by an in-sync change read before it)."""
    files = Certificates(tmp_path / "certs").issue("a", Role.NODE)
    serving = ServingNode(etcd_server.url, "a", str(tmp_path / "a"), tls=files)
    try:
        token = etcd.put(owner_key("r"), node_value("a"))
        etcd.put(replicas_key("r"), ReplicaSet(3, ("b", "d"), ("b",)).value())
        assert serving.node.adopt("r", token, serving.node.lease.lease_id)
        counted = _CountedLock()
        serving._in_sync_lock = cast(threading.Lock, counted)
        assert serving.replica_step("refollow", "r") == {"session": "r", "refollowed": True}
        assert counted.taken == 1
        assert [n for n, _a in serving.replication["r"].followers] == ["b", "d"]  # read again
        assert serving.replication["r"].in_sync == ("b",)  # out of sync: caught up when idle
    finally:
        serving.client.close()
