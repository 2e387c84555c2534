"""``ClusterClient(owner_wait=...)``: a request to a session nobody owns waits for a
takeover, watching its owner key in etcd, instead of failing at once (a real etcd)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from supervisor.client.cluster import ClusterClient
from supervisor.cluster.errors import NotOwner
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.ownership import acquire, place_new
from supervisor.cluster.routing import Route
from tests.harness.cluster_support import register
from tests.harness.etcd_server import EtcdServer

pytestmark = pytest.mark.timeout(60)


def _note_watches(cluster: ClusterClient) -> threading.Event:
    """An event set when ``cluster`` begins to watch etcd (its watch is wrapped)."""
    watching = threading.Event()
    watch = cluster.etcd.watch

    def noted_watch(*args: object, **kwargs: object) -> object:
        watching.set()
        return watch(*args, **kwargs)  # type: ignore[arg-type]

    cluster.etcd.watch = noted_watch  # type: ignore[method-assign,assignment]
    return watching


def test_a_request_without_an_owner_waits_for_the_takeover_and_routes_there(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    with EtcdClient(etcd.url) as client, ClusterClient(etcd.url, owner_wait=30.0) as cluster:
        a = register(client, "a", tmp_path / "a")
        place_new(client, "s1", "a", a.lease_id)
        a.lease.close()  # its node gone: nobody owns s1 (a failover's first second)
        watching = _note_watches(cluster)
        taken: list[int] = []

        def take_over() -> None:  # once the client waits: the placed node is back
            if watching.wait(20):
                b = register(client, "a", tmp_path / "a")
                taken.append(acquire(client, "s1", "a", b.lease_id))

        helper = threading.Thread(target=take_over)
        helper.start()
        try:
            found = cluster._route("s1", fresh=True)
        finally:
            helper.join()
        assert watching.is_set()  # it waited: nobody owned s1 when it looked
        assert isinstance(found, Route)
        assert (found.node, found.token) == ("a", taken[0])


def test_without_owner_wait_a_request_to_an_unowned_session_fails_at_once(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    with EtcdClient(etcd.url) as client, ClusterClient(etcd.url) as cluster:
        a = register(client, "a", tmp_path / "a")
        place_new(client, "s1", "a", a.lease_id)
        a.lease.close()
        with pytest.raises(NotOwner, match="no node owns it now"):
            cluster._route("s1", fresh=True)


def test_a_retry_after_an_unreachable_owner_waits_only_until_its_owner_key_changes(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    """The pause between tries of a dead owner ends when its lease expires (the owner
    key goes), not when the pause that grew meanwhile runs out."""
    with EtcdClient(etcd.url) as client, ClusterClient(etcd.url) as cluster:
        a = register(client, "a", tmp_path / "a")
        place_new(client, "s1", "a", a.lease_id)
        found = cluster._route("s1", fresh=True)
        watching = _note_watches(cluster)

        def lose_the_owner() -> None:  # once the client waits: a's lease ends
            if watching.wait(20):
                a.lease.close()

        helper = threading.Thread(target=lose_the_owner)
        helper.start()
        started = time.monotonic()
        try:
            cluster._await_owner_change(found, 60.0)
        finally:
            helper.join()
        assert watching.is_set()
        assert time.monotonic() - started < 30  # woken by the change, not the pause's end
        with pytest.raises(NotOwner):
            cluster._route("s1", fresh=True)  # and the owner key is gone indeed


def test_a_retry_whose_owner_key_stays_pauses_its_whole_pause_even_without_etcd(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    with EtcdClient(etcd.url) as client, ClusterClient(etcd.url) as cluster:
        a = register(client, "a", tmp_path / "a")
        place_new(client, "s1", "a", a.lease_id)
        found = cluster._route("s1", fresh=True)
        started = time.monotonic()
        cluster._await_owner_change(found, 0.4)  # a worker restarting: the key stays
        assert time.monotonic() - started >= 0.4
    with ClusterClient("http://127.0.0.1:9") as away:  # nothing listens: no watch
        started = time.monotonic()
        away._await_owner_change(found, 0.4)
        assert time.monotonic() - started >= 0.4
