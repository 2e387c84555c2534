"""The etcd v3 JSON gateway client against a real etcd on loopback."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from supervisor.cluster.errors import EtcdRequestFailed, EtcdUnavailable
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.etcd_types import Delete, Get, Put, absent, modified_at, value_is
from tests.harness.etcd_server import EtcdServer, free_port
from tests.harness.support import poll_until


@pytest.fixture
def client(etcd: EtcdServer) -> Iterator[EtcdClient]:
    with EtcdClient(etcd.url) as client:
        yield client


def test_put_then_get_returns_the_value_and_its_revisions(client: EtcdClient) -> None:
    revision = client.put("/loopd/a", b"\x00value\xff")
    kv = client.get("/loopd/a")
    assert kv is not None
    assert (kv.key, kv.value) == ("/loopd/a", b"\x00value\xff")
    assert kv.create_revision == kv.mod_revision == revision
    assert kv.version == 1


def test_get_of_a_missing_key_returns_none(client: EtcdClient) -> None:
    assert client.get("/loopd/missing") is None


def test_range_with_prefix_returns_only_the_keys_under_it(client: EtcdClient) -> None:
    for key in ("/loopd/nodes/a", "/loopd/nodes/b", "/loopd/nodesx", "/loopd/owner/a"):
        client.put(key, b"1")
    found = client.range("/loopd/nodes/", prefix=True)
    assert [kv.key for kv in found] == ["/loopd/nodes/a", "/loopd/nodes/b"]


def test_delete_with_prefix_returns_how_many_keys_it_deleted(client: EtcdClient) -> None:
    client.put("/p/1", b"1")
    client.put("/p/2", b"2")
    assert client.delete("/p/", prefix=True) == 2
    assert client.delete("/p/1") == 0


def test_txn_on_an_absent_key_creates_it_once_and_a_second_fails_with_its_read(
    client: EtcdClient,
) -> None:
    first = client.txn([absent("/o")], [Put(key="/o", value=b"a")], [Get(key="/o")])
    second = client.txn([absent("/o")], [Put(key="/o", value=b"b")], [Get(key="/o")])
    assert first.succeeded
    assert not second.succeeded
    assert [kv.value for kv in second.reads[0]] == [b"a"]
    assert second.reads[0][0].mod_revision == first.revision


def test_txn_compare_on_mod_revision_refuses_a_stale_token(client: EtcdClient) -> None:
    token = client.put("/o", b"a")
    newer = client.txn([modified_at("/o", token)], [Put(key="/o", value=b"b")])
    stale = client.txn([modified_at("/o", token)], [Put(key="/o", value=b"c")])
    assert newer.succeeded
    assert newer.revision > token
    assert not stale.succeeded
    kv = client.get("/o")
    assert kv is not None
    assert kv.value == b"b"


def test_txn_compare_on_value_and_delete_in_one_transaction(client: EtcdClient) -> None:
    client.put("/placement/s", b'{"node":"a"}')
    wrong = client.txn([value_is("/placement/s", b'{"node":"b"}')], [Delete(key="/placement/s")])
    right = client.txn([value_is("/placement/s", b'{"node":"a"}')], [Delete(key="/placement/s")])
    assert (wrong.succeeded, right.succeeded) == (False, True)
    assert client.get("/placement/s") is None


def test_a_key_bound_to_a_lease_vanishes_when_the_lease_is_revoked(client: EtcdClient) -> None:
    lease = client.lease_grant(30)
    assert lease.ttl == 30
    client.put("/nodes/a", b"x", lease=lease.id)
    kv = client.get("/nodes/a")
    assert kv is not None
    assert kv.lease == lease.id
    client.lease_revoke(lease.id)
    assert client.get("/nodes/a") is None


def test_keepalive_of_a_live_lease_returns_its_ttl(client: EtcdClient) -> None:
    lease = client.lease_grant(20)
    assert client.lease_keepalive(lease.id) == 20


def test_keepalive_of_an_expired_lease_returns_zero_and_its_keys_are_gone(
    client: EtcdClient,
) -> None:
    lease = client.lease_grant(1)
    client.put("/owner/s", b"x", lease=lease.id)
    poll_until(lambda: client.get("/owner/s") is None, timeout=10, what="the lease to expire")
    assert client.lease_keepalive(lease.id) == 0


def test_put_with_an_unknown_lease_is_refused_with_etcds_message(client: EtcdClient) -> None:
    with pytest.raises(EtcdRequestFailed, match="lease not found"):
        client.put("/k", b"v", lease=12345)


def test_watch_returns_the_changes_since_a_revision_up_to_max_events(client: EtcdClient) -> None:
    start = client.put("/w/a", b"1")
    client.put("/w/b", b"2")
    client.delete("/w/a")
    events = client.watch("/w/", start_revision=start, prefix=True, max_events=3, wait=5)
    assert [(e.kind, e.kv.key) for e in events] == [
        ("PUT", "/w/a"),
        ("PUT", "/w/b"),
        ("DELETE", "/w/a"),
    ]


def test_watch_without_a_change_returns_nothing_after_its_wait(client: EtcdClient) -> None:
    revision = client.put("/other", b"1")
    began = time.monotonic()
    assert client.watch("/w/", start_revision=revision + 1, prefix=True, wait=0.3) == []
    assert time.monotonic() - began < 2


def test_an_unreachable_etcd_raises_etcd_unavailable_with_its_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with EtcdClient(url, timeout=0.5) as client:
        with pytest.raises(EtcdUnavailable, match=f"{url}: etcd unavailable"):
            client.get("/k")
        with pytest.raises(EtcdUnavailable):
            client.lease_keepalive(1)


def test_the_client_reconnects_once_etcd_is_back(etcd: EtcdServer) -> None:
    with EtcdClient(etcd.url, timeout=0.5) as client:
        client.put("/k", b"1")
        etcd.stop()
        with pytest.raises(EtcdUnavailable):
            client.get("/k")
        etcd.start()
        kv = client.get("/k")
    assert kv is not None
    assert kv.value == b"1"


def test_a_url_that_is_not_http_host_port_is_refused() -> None:
    with pytest.raises(ValueError, match="must be http://host:port"):
        EtcdClient("https://etcd.example")
    with pytest.raises(ValueError, match="is https: give --tls-ca"):
        EtcdClient("http://127.0.0.1:1,https://etcd.example:2379")
