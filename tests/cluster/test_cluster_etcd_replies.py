"""The etcd client against bad replies from a fake etcd: each is a ClusterError, in bounded time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from supervisor.cluster.errors import ClusterError, EtcdRequestFailed, EtcdUnavailable
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.etcd_types import Put, absent
from tests.harness.fake_etcd import (
    LEADER_CHANGED,
    NOT_JSON,
    TTL_NOT_INTEGER,
    BadReply,
    FakeEtcd,
    dripping,
)

CALLS: dict[str, Callable[[EtcdClient], object]] = {
    "get": lambda client: client.get("/loopd/k"),
    "txn": lambda client: client.txn([absent("/k")], [Put(key="/k", value=b"v")]),
    "lease_grant": lambda client: client.lease_grant(5),
    "lease_keepalive": lambda client: client.lease_keepalive(7),
    "lease_revoke": lambda client: client.lease_revoke(7),
}


@pytest.fixture
def fake() -> Iterator[FakeEtcd]:
    server = FakeEtcd(None)
    try:
        yield server
    finally:
        server.close()


CODE_NOT_INTEGER = BadReply(status=200, body=b'{"error":"x","code":"fourteen","message":"m!"}')
BAD_FIELDS = BadReply(status=200, body=b'{"kvs":[{"key":"!!!"}],"header":{"revision":"x"}}')
CASES = [
    *[(LEADER_CHANGED, name, "leader changed") for name in CALLS],
    *[(NOT_JSON, name, "not JSON") for name in CALLS],
    *[(CODE_NOT_INTEGER, name, "m!") for name in CALLS],
    (TTL_NOT_INTEGER, "lease_grant", "'TTL' is not an integer: 'soon'"),
    (TTL_NOT_INTEGER, "lease_keepalive", "'TTL' is not an integer: 'soon'"),
    (BAD_FIELDS, "get", "unexpected reply"),
    (BAD_FIELDS, "txn", "'revision' is not an integer: 'x'"),
    (BAD_FIELDS, "lease_grant", "no lease ID"),
]
NAMES = {LEADER_CHANGED: "leader-changed", NOT_JSON: "not-json", TTL_NOT_INTEGER: "ttl-not-int",
         CODE_NOT_INTEGER: "code-not-int", BAD_FIELDS: "bad-fields"}  # fmt: skip


@pytest.mark.parametrize(
    ("reply", "call", "why"), CASES, ids=[f"{NAMES[r]}-{c}" for r, c, _ in CASES]
)
def test_each_bad_reply_of_etcd_is_a_cluster_error_that_names_it(
    fake: FakeEtcd, reply: BadReply, call: str, why: str
) -> None:
    fake.answer(reply)
    with EtcdClient(fake.url, timeout=2) as client, pytest.raises(ClusterError) as caught:
        CALLS[call](client)
    assert fake.url in str(caught.value)
    assert why in str(caught.value)


def test_an_etcd_503_leader_changed_is_a_request_failed_with_its_code(fake: FakeEtcd) -> None:
    fake.answer(LEADER_CHANGED)
    with (
        EtcdClient(fake.url, timeout=2) as client,
        pytest.raises(EtcdRequestFailed, match=r"code 14\)?: .*leader changed") as caught,
    ):
        client.lease_keepalive(7)
    assert caught.value.code == 14


@pytest.mark.parametrize("call", list(CALLS.values()), ids=list(CALLS))
def test_an_etcd_dripping_its_reply_byte_by_byte_times_out_within_the_call_deadline(
    fake: FakeEtcd, call: Callable[[EtcdClient], object]
) -> None:
    fake.answer(dripping(0.05))  # a byte every 50 ms: no single read ever waits 1 s
    began = time.monotonic()
    with (
        EtcdClient(fake.url, timeout=1.0) as client,
        pytest.raises(EtcdUnavailable, match="within 1 s"),
    ):
        call(client)
    assert time.monotonic() - began < 2.5


@pytest.mark.parametrize(
    "url",
    ["ftp://x:1", "http://[::1", "http://x:99999", "http://\u00fc:1", "http://x", "http://:1"],
)
def test_a_url_etcd_cannot_be_reached_at_is_refused_with_one_value_error_naming_it(
    url: str,
) -> None:
    with pytest.raises(ValueError, match="etcd URL must be http://host:port, got"):
        EtcdClient(url)
