"""The failover watch: it acts on the owner key's deletion, and the furthest copy wins.

A real etcd; the old owner's lease revoked (what its expiry does). A follower whose scan
interval is a minute takes the session over within seconds: the watch of the owner keys
wakes it, not its interval. Of two in-sync followers, the one whose copy ends further
(a real ``loopd serve`` answering on its TLS port) takes over; the other leaves it to it.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import cast

import pytest

from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.failover_rank import copy_end, further_follower
from supervisor.cluster.failover_watch import FailoverWatch
from supervisor.cluster.node import ClusterNode
from supervisor.cluster.ownership import owner_of
from supervisor.cluster.replica_set import place_replicas, replicas_of
from supervisor.cluster.transport import Role
from tests.cluster_support import create_session, register, send
from tests.etcd_server import EtcdServer, free_port
from tests.support import Daemon, poll_until
from tests.tls_certs import Certificates
from worker.store.layout import SESSIONS_DIR
from worker.store.replica_roles import replicas_root

pytestmark = pytest.mark.timeout(90)


class CountedWatch(FailoverWatch):
    """A watch that counts its scans (the test revokes the lease after the first)."""

    scans = 0

    def scan(self) -> list[str]:
        found = super().scan()
        self.scans += 1
        return found


def _copy(source: Path, home: Path) -> None:
    shutil.copytree(source / SESSIONS_DIR / "r", Path(replicas_root(home)) / SESSIONS_DIR / "r")


def test_a_follower_takes_over_on_the_owner_keys_deletion_not_its_interval(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    with EtcdClient(etcd.url) as client:
        a, b = (register(client, name, tmp_path / name, ttl=60) for name in "ab")
        token = create_session(client, a, "r")
        place_replicas(client, "r", token, 2, ["b"])
        _copy(a.home, b.home)
        taken = threading.Event()
        watch = CountedWatch(client, cast(ClusterNode, b), 60.0,
                             lambda _s, _t: taken.set(), lambda _line: None)  # fmt: skip
        watch.start()
        try:
            poll_until(lambda: watch.scans >= 1, what="the watch's first scan")
            client.lease_revoke(a.lease_id)  # what the owner's lease expiring does
            # Its interval is 60 s: only the deletion's event wakes it this soon.
            poll_until(taken.is_set, timeout=20, what="b's takeover after the deletion")
        finally:
            watch.close()
        owner = owner_of(client, "r")
        assert owner is not None
        assert owner.node == "b"
        assert owner.token > token


def test_of_two_in_sync_followers_the_one_whose_copy_is_further_takes_over(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    certs = Certificates(tmp_path / "certs")
    address = f"tls://127.0.0.1:{free_port()}"
    with EtcdClient(etcd.url) as client:
        a, b = (register(client, name, tmp_path / name, ttl=60) for name in "ab")
        token = create_session(client, a, "r")
        send(a.home, "r", "k1")
        _copy(a.home, b.home)  # b's copy ends at k1
        send(a.home, "r", "k2")  # shipped to c only when the owner died
        c_home = tmp_path / "c"
        _copy(a.home, c_home)
        place_replicas(client, "r", token, 3, ["b", "c"], addresses={"c": address})
        files = certs.issue("c", Role.NODE)
        c = Daemon(c_home, "--cluster", etcd.url, "--node", "c", "--lease-ttl", "3",
                   "--listen", address, *certs.args(files))  # fmt: skip
        try:
            b_files = certs.issue("b", Role.NODE)
            current = replicas_of(client, "r")
            assert current is not None
            mine = copy_end(str(b.home), "r")
            assert mine < copy_end(str(c_home), "r")
            assert further_follower(current, "b", "r", mine, b_files) == "c"  # asked c
            assert further_follower(current, "c", "r", copy_end(str(c_home), "r"), b_files) is None
            watch = FailoverWatch(client, cast(ClusterNode, b), 60.0, lambda _s, _t: None,
                                  lambda _line: None, b_files)  # fmt: skip
            client.lease_revoke(a.lease_id)  # what the owner's lease expiring does
            # b scans at once; c's daemon may have taken it over already: either way b
            # does not, though it is as much in sync and nearer in time.
            assert watch.scan() == []

            def owner() -> str | None:
                found = owner_of(client, "r")
                return None if found is None else found.node

            assert poll_until(owner, timeout=30, what="a new owner") == "c"
            assert watch.scan() == []
        finally:
            c.stop()
