"""The owner's daemon keeps its worker's followers equal to etcd's replica set on its own
(``supervisor/cluster/replica_watch.py``, docs/scaling.md 9.2 and 9.5): a mover killed
right after its ``grow`` or ``shrink`` transaction never calls ``refollow``, and the
owner's worker is restarted with the followers etcd lists all the same. Four real
``loopd serve`` nodes with TLS ports, a real etcd, a session of 3 copies."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import psutil
import pytest

from supervisor.cli.cluster_commands import RemoteNodes
from supervisor.client.cluster import ClusterClient
from supervisor.client.control import call
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import node_value, owner_key
from supervisor.cluster.replica_grow import grow, shrink
from supervisor.cluster.replica_placement import WorkerReplication
from supervisor.cluster.replica_set import ReplicaSet, replicas_key
from supervisor.cluster.replica_watch import ReplicaWatch, followers_differ
from supervisor.cluster.serving import ServingNode
from supervisor.cluster.transport import Role, TlsFiles
from tests.etcd_server import EtcdServer, free_port
from tests.replica_nodes import NAMES, Nodes
from tests.support import poll_until
from tests.test_replica_move import _write_keys
from tests.tls_certs import Certificates

pytestmark = pytest.mark.timeout(90)


HANG_TIMEOUT = "120"
"""The nodes' hang timeout: a worker's loop turns on its own every 30 s (a quarter of it),
so a follower caught up within seconds was not waiting for such a turn."""


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    """``replica_nodes.running_nodes``'s four nodes, started and stopped together."""
    root = tmp_path / "rf"
    root.mkdir()
    etcd = EtcdServer(root / "etcd")
    etcd.start()
    addresses = {name: f"tls://127.0.0.1:{free_port()}" for name in NAMES}
    cluster = Nodes(root, etcd, Certificates(root / "certs"), addresses)
    try:
        with ThreadPoolExecutor(len(NAMES)) as starting:
            started = [starting.submit(cluster.start, name, "--hang-timeout", HANG_TIMEOUT)
                       for name in NAMES]  # fmt: skip
        for future in started:
            future.result()  # a node that did not start fails the test, named
        yield cluster
    finally:
        _stop_together(cluster)
        etcd.stop()


def _stop_together(cluster: Nodes) -> None:
    """SIGTERM every daemon at once (each stops its workers meanwhile), then reap each
    and any worker left: the nodes stop in the time of one."""
    workers = [proc for daemon in cluster.daemons.values() for proc in daemon.workers()]
    for daemon in cluster.daemons.values():
        if daemon.proc.poll() is None:
            daemon.proc.send_signal(signal.SIGTERM)
    for daemon in cluster.daemons.values():
        daemon.stop()
    _gone, alive = psutil.wait_procs(workers, timeout=10)
    for proc in alive:
        proc.kill()
    psutil.wait_procs(alive, timeout=10)


class KilledMover:
    """The calls of a mover SIGKILLed right after its transaction: none reaches a node."""

    def __init__(self) -> None:
        self.unsent: list[tuple[str, str]] = []

    def __call__(self, node: str, op: str, session: str) -> object:
        self.unsent.append((node, op))
        return None


def _lag_rows(nodes: Nodes, owner: str) -> dict[str, dict[str, object]]:
    """The followers the owner's worker reports (its status's lag rows), by node."""
    rows = call(str(nodes.root / owner), "status", timeout=10, session="r")
    assert isinstance(rows, list)
    found = rows[0].get("lag") if rows and isinstance(rows[0], dict) else None
    return {str(f["node"]): f for f in found or [] if isinstance(f, dict)}


class Probes:
    """Writes one key more at each call, then reads the followers the owner's worker
    reports (it reports after a write): true once they are ``wanted``."""

    def __init__(self, client: ClusterClient, nodes: Nodes, owner: str) -> None:
        self.client = client
        self.nodes = nodes
        self.owner = owner
        self.keys: list[str] = []

    def followers_are(self, wanted: list[str]) -> bool:
        key = f"p{len(self.keys)}"
        assert self.client.send("r", key, key=key)["duplicate"] is False
        self.keys.append(key)
        return sorted(_lag_rows(self.nodes, self.owner)) == wanted


def _worker_pids(nodes: Nodes, owner: str) -> set[int]:
    return {proc.pid for proc in nodes.daemons[owner].workers()}


def _keys_on(nodes: Nodes, name: str, wanted: list[str]) -> bool:
    return nodes.copy_keys(name) == wanted


def test_a_follower_shrunk_out_in_etcd_alone_is_dropped_by_the_owner_worker(
    nodes: Nodes,
) -> None:
    with nodes.client() as client, EtcdClient(nodes.etcd.url) as etcd:
        client.create("r")
        owner, _token = nodes.owner()
        first = nodes.replica_set()
        (spare,) = (n for n in NAMES if n != owner and n not in first.followers)
        leaving = first.followers[0]
        _write_keys(client, range(2))
        files = nodes.certs.issue("ops", Role.OPERATOR)
        mover = RemoteNodes(etcd, files)
        try:  # a real grow first: the spare in sync, the worker restarted by refollow
            assert grow(etcd, "r", spare, mover, timeout=30) is True
        finally:
            mover.close()
        probes = Probes(client, nodes, owner)
        every_follower = sorted((*first.followers, spare))
        poll_until(lambda: probes.followers_are(every_follower), timeout=15,
                   what="the owner's worker reporting the three followers")  # fmt: skip
        killed = KilledMover()
        written = shrink(etcd, "r", leaving, killed)  # the transaction; nothing after it
        assert leaving not in written.followers
        assert killed.unsent == [(owner, "refollow"), (leaving, "unfollow")]
        staying = sorted(n for n in (*first.followers, spare) if n != leaving)
        shipped_to_leaving = ["k0", "k1", *probes.keys]
        poll_until(lambda: probes.followers_are(staying), timeout=15,
                   what=f"the owner's worker without {leaving}")  # fmt: skip
        _write_keys(client, range(2, 5))
        assert sorted(nodes.replica_set().in_sync) == staying
        every = ["k0", "k1", *probes.keys, "k2", "k3", "k4"]
    for name in staying:
        poll_until(partial(_keys_on, nodes, name, every),
                   what=f"{name}'s copy holding every key")  # fmt: skip
    # The leaving copy got nothing written after the worker's restart without it.
    held = nodes.copy_keys(leaving)
    assert held[: len(shipped_to_leaving)] == shipped_to_leaving
    assert "k2" not in held


def test_a_follower_grown_in_etcd_alone_is_caught_up_and_put_in_sync(nodes: Nodes) -> None:
    with nodes.client() as client, EtcdClient(nodes.etcd.url) as etcd:
        client.create("r")
        owner, _token = nodes.owner()
        first = nodes.replica_set()
        (spare,) = (n for n in NAMES if n != owner and n not in first.followers)
        _write_keys(client, range(3))
        before = _worker_pids(nodes, owner)
        killed = KilledMover()
        # The transaction, then grow's wait for the copy in sync: no refollow reaches the
        # owner, and no status either (no progress seen: it gives up 20 s from now).
        assert grow(etcd, "r", spare, killed, timeout=20) is True
        assert (owner, "refollow") in killed.unsent
        assert {op for _node, op in killed.unsent} <= {"refollow", "status"}
        current = nodes.replica_set()
        assert sorted(current.in_sync) == sorted((*first.followers, spare))
        assert _worker_pids(nodes, owner) != before  # restarted with the spare
        log = nodes.daemons[owner].log_path.read_text(errors="replace")
        assert f"r: its followers in etcd are {', '.join(current.followers)}" in log
        # A mover's refollow arriving late restarts nothing: the worker has these already.
        after = _worker_pids(nodes, owner)
        mover = RemoteNodes(etcd, nodes.certs.issue("ops", Role.OPERATOR))
        try:
            assert mover(owner, "refollow", "r") == {"session": "r", "refollowed": False}
        finally:
            mover.close()
        assert _worker_pids(nodes, owner) == after
        _write_keys(client, range(3, 5))
    every = [f"k{n}" for n in range(5)]
    for name in (*first.followers, spare):
        poll_until(partial(_keys_on, nodes, name, every),
                   what=f"{name}'s copy holding every key")  # fmt: skip


def _view(*followers: tuple[str, str]) -> WorkerReplication:
    files = TlsFiles("ca", "cert", "key")
    return WorkerReplication(3, followers, (), files, "sock")


@pytest.mark.parametrize(
    ("current", "live", "differ"),
    [
        (ReplicaSet(3, ("b", "c"), ()), {"b": "tls://b", "c": "tls://c"}, False),
        (ReplicaSet(3, ("c", "b"), ("b",)), {"b": "tls://b"}, False),  # c down, in-sync aside
        (ReplicaSet(3, ("b", "c", "d"), ("b", "c")), {}, True),  # one more
        (ReplicaSet(3, ("b",), ("b",)), {}, True),  # one less
        (ReplicaSet(3, ("b", "d"), ("b",)), {}, True),  # one other
        (ReplicaSet(3, ("b", "c"), ()), {"c": "tls://c2"}, True),  # c registered elsewhere
    ],
)
def test_followers_are_compared_by_name_and_live_address_only(
    current: ReplicaSet, live: dict[str, str], differ: bool
) -> None:
    view = _view(("b", "tls://b"), ("c", "tls://c"))
    assert followers_differ(view, current, live) is differ


def test_an_unregistered_follower_the_set_has_an_address_of_now_differs() -> None:
    """Started while c was not registered (no address): the set's address for it counts."""
    view = _view(("b", "tls://b"), ("c", ""))
    current = ReplicaSet(3, ("b", "c"), (), 0, (("c", "tls://c"),))
    assert followers_differ(view, current, {}) is True
    assert followers_differ(view, ReplicaSet(3, ("b", "c"), ()), {}) is False


def test_a_scan_reads_again_only_a_set_whose_followers_changed(tmp_path: Path) -> None:
    """What the watch's scan (also its fallback for a missed event) does, on a real etcd:
    an in-sync change is the worker's own, a follower changed is read again and handed
    on once, a value that is not a replica set is reported once and changes nothing."""
    server = EtcdServer(tmp_path / "etcd")
    server.start()
    files = Certificates(tmp_path / "certs").issue("a", Role.NODE)
    serving = ServingNode(server.url, "a", str(tmp_path / "a"), tls=files)
    changed: list[str] = []
    reports: list[str] = []
    watch = ReplicaWatch(serving, changed.append, reports.append)
    try:
        etcd = serving.client
        token = etcd.put(owner_key("r"), node_value("a"))
        etcd.put(replicas_key("r"), ReplicaSet(3, ("b", "c"), ("b", "c")).value())
        assert serving.node.adopt("r", token, serving.node.lease.lease_id)
        assert serving.refollow("r") is True  # first read: none before
        assert watch.scan() == []
        etcd.put(replicas_key("r"), ReplicaSet(3, ("b", "c"), ("b",)).value())
        assert watch.scan() == []  # in-sync only
        etcd.put(replicas_key("r"), ReplicaSet(3, ("b", "d"), ("b",)).value())
        assert watch.scan() == ["r"]
        assert changed == ["r"]
        assert [n for n, _a in serving.replication["r"].followers] == ["b", "d"]
        assert serving.replication["r"].in_sync == ("b",)
        assert watch.scan() == []  # read again: nothing more to do
        etcd.put(replicas_key("r"), b"not json")
        assert watch.scan() == []
        assert watch.scan() == []
        assert len(reports) == 1
        assert reports[0].startswith("cluster: r: its replica set in etcd is not readable, "
                                     "its worker's followers are kept: ")  # fmt: skip
        assert [n for n, _a in serving.replication["r"].followers] == ["b", "d"]
        serving.node.drop("r")  # not held here: not compared
        etcd.put(replicas_key("r"), ReplicaSet(3, ("c", "d"), ()).value())
        assert watch.scan() == []
    finally:
        serving.client.close()
        server.stop()
