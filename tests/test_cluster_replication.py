"""Replicated sessions with real processes: an owner shipping to followers over TLS.

The followers are real ``loopd serve`` daemons with a TLS port (their gateway writes
the copies); the owner is ``tests/replica_owner_process.py``, a cluster node that
ships each write (``worker.replication``) before acknowledging it; etcd is real. A
key acknowledged is on every in-sync follower's disk when the owner is SIGKILLed
right after; a follower SIGKILLed is out of the in-sync set in etcd before the next
reply, and writes are refused until it rejoins; a lower token is refused by the
follower where it writes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.peer_link import NodeLink
from supervisor.cluster.replica_set import ReplicaSet, replicas_of
from supervisor.cluster.transport import Role, TlsFiles
from supervisor.errors import ControlError
from tests.etcd_server import EtcdServer, free_port
from tests.support import Daemon, log_user_keys
from tests.tls_certs import Certificates
from worker.store.loader import load_session
from worker.store.replica_types import Step

pytestmark = pytest.mark.timeout(90)
SESSION = "r"


@dataclass
class Replicated:
    root: Path
    etcd: EtcdServer
    certs: Certificates
    followers: dict[str, Daemon]
    addresses: dict[str, str]
    owner: subprocess.Popen[str] | None = None
    ready: dict[str, object] = field(default_factory=dict)

    def follower(self, name: str) -> Daemon:
        files = self.certs.issue(name, Role.NODE)
        args = ["--cluster", self.etcd.url, "--node", name, "--lease-ttl", "2"]
        args += ["--listen", self.addresses[name], *self.certs.args(files)]
        daemon = Daemon(self.root / name, *args)
        self.followers[name] = daemon
        return daemon

    def start_owner(self, replicas: int) -> dict[str, object]:
        files = self.certs.issue("a", Role.NODE)
        config = {
            "url": self.etcd.url, "node": "a", "home": str(self.root / "a"), "ttl": 10,
            "tls": {"ca": files.ca, "cert": files.cert, "key": files.key},
            "replicas": replicas, "followers": self.addresses,
        }  # fmt: skip
        self.owner = subprocess.Popen(
            [sys.executable, "-m", "tests.replica_owner_process", json.dumps(config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.ready = self._reply()
        return self.ready

    def ask(self, line: str) -> dict[str, object]:
        assert self.owner is not None
        assert self.owner.stdin is not None
        self.owner.stdin.write(line + "\n")
        self.owner.stdin.flush()
        return self._reply()

    def _reply(self) -> dict[str, object]:
        assert self.owner is not None
        assert self.owner.stdout is not None
        line = self.owner.stdout.readline()
        assert line, "the owner process ended"
        reply: dict[str, object] = json.loads(line)
        return reply

    def replica_set(self) -> ReplicaSet | None:
        with EtcdClient(self.etcd.url) as client:
            return replicas_of(client, SESSION)

    def copy_keys(self, name: str) -> list[str | None]:
        """The keys in follower ``name``'s copy, read from its disk after checking it."""
        copies = self.root / name / "replicas"
        load_session(str(copies / "sessions" / SESSION), SESSION, history=True)
        return log_user_keys(copies, SESSION)

    def kill_owner(self) -> None:
        if self.owner is not None and self.owner.poll() is None:
            self.owner.send_signal(signal.SIGKILL)
        if self.owner is not None:
            self.owner.wait()
            for stream in (self.owner.stdin, self.owner.stdout):
                if stream is not None:
                    stream.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Replicated]:
    root = tmp_path / "rep"
    root.mkdir()
    etcd = EtcdServer(root / "etcd")
    etcd.start()
    addresses = {name: f"tls://127.0.0.1:{free_port()}" for name in ("b", "c")}
    replicated = Replicated(root, etcd, Certificates(root / "certs"), {}, addresses)
    try:
        for name in addresses:
            replicated.follower(name)
        yield replicated
    finally:
        replicated.kill_owner()
        for daemon in replicated.followers.values():
            daemon.stop()
        etcd.stop()


def test_an_acknowledged_key_is_on_every_follower_when_the_owner_is_sigkilled(
    cluster: Replicated,
) -> None:
    ready = cluster.start_owner(replicas=3)
    assert ready["lost"] == []
    assert cluster.replica_set() == ReplicaSet(3, ("b", "c"), ("b", "c"), _revision(cluster))
    acknowledged = []
    for n in range(6):
        if n == 3:
            assert cluster.ask("compact")["ok"] is True  # an epoch commit, shipped too
        reply = cluster.ask(f"send k{n}")
        assert reply["ok"] is True, reply
        acknowledged.append(f"k{n}")
    cluster.owner.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
    cluster.kill_owner()
    for name in ("b", "c"):
        assert cluster.copy_keys(name) == acknowledged  # each once, in the owner's order
    owner_log = cluster.root / "a" / "sessions" / SESSION
    copy = cluster.root / "b" / "replicas" / "sessions" / SESSION
    for log in owner_log.glob("*.jsonl"):
        assert (copy / log.name).read_bytes() == log.read_bytes()


def _revision(cluster: Replicated) -> int:
    current = cluster.replica_set()
    assert current is not None
    return current.revision


def test_a_follower_killed_is_out_of_the_in_sync_set_before_the_next_reply(
    cluster: Replicated,
) -> None:
    cluster.start_owner(replicas=3)  # a majority, 2 of the 3 copies, must be in sync
    assert cluster.ask("send k1")["ok"] is True
    cluster.followers["c"].proc.send_signal(signal.SIGKILL)
    cluster.followers["c"].stop()
    # Acknowledged by every follower still in sync, and by the time the owner answered,
    # etcd no longer counts c.
    assert cluster.ask("send k2")["ok"] is True
    replica_set = cluster.replica_set()
    assert replica_set is not None
    assert replica_set.in_sync == ("b",)
    cluster.followers["b"].proc.send_signal(signal.SIGKILL)
    cluster.followers["b"].stop()
    lost = cluster.ask("send k3")  # durable on the owner only: not acknowledged
    assert lost["ok"] is False
    assert "follower b did not acknowledge" in str(lost["error"])
    refused = cluster.ask("send k4")
    assert refused["before_write"] is True
    assert "1 of its 3 copies are in sync, 2 are needed (not in sync: b, c)" in str(
        refused["error"]
    )
    assert "\n" not in str(refused["error"])
    replica_set = cluster.replica_set()
    assert replica_set is not None
    assert replica_set.in_sync == ()
    # c comes back: it catches up from its last valid line and is in sync again.
    cluster.follower("c")
    assert cluster.ask("rejoin") == {"joined": ["c"], "in_sync": ["c"]}
    replica_set = cluster.replica_set()
    assert replica_set is not None
    assert replica_set.in_sync == ("c",)
    assert cluster.ask("send k5")["ok"] is True
    assert cluster.copy_keys("c") == ["k1", "k2", "k3", "k5"]
    assert cluster.copy_keys("b") == ["k1", "k2"]


def test_a_follower_refuses_a_lower_token_where_it_writes(cluster: Replicated) -> None:
    token = cluster.start_owner(replicas=3)["token"]
    assert isinstance(token, int)
    assert cluster.ask("send k1")["ok"] is True
    copy_log = cluster.root / "b" / "replicas" / "sessions" / SESSION / "0.jsonl"
    held = copy_log.read_bytes()
    files = cluster.certs.issue("z", Role.NODE)  # a deposed owner: a node of the cluster
    link = NodeLink(cluster.addresses["b"], "b", files, timeout=10)
    try:
        stale = Step(SESSION, 0, len(held), 0, b"{}\n", token - 1)
        with pytest.raises(ControlError) as caught:
            link.call("replicate", step=stale.to_message())
        assert caught.value.code == "not_owner"
        assert f"z with token {token - 1} is not its owner (etcd names owner a with token " in (
            caught.value.message
        )
        assert "\n" not in str(caught.value)
        # A higher token from a node that does not own the session would raise the copy's
        # fence for good (the owner's steps then refused), or a rewind cut its tail away:
        # only etcd's owner, with its token, writes a copy.
        for higher in (Step(SESSION, 0, len(held), 0, b"{}\n", token + 100),
                       Step(SESSION, 1, 0, 0, b"{}\n", token + 100, baseline=b"{}")):  # fmt: skip
            with pytest.raises(ControlError) as caught:
                link.call("replicate", step=higher.to_message())
            assert caught.value.code == "not_owner", caught.value
            assert f"with token {token + 100} is not its owner" in caught.value.message
        with pytest.raises(ControlError) as caught:
            link.call("replica_rewind", session=SESSION, position=[0, 0, 0], token=token + 100)
        assert caught.value.code == "not_owner"
    finally:
        link.close()
    owner_files = cluster.certs.issue("a", Role.NODE)  # the owner's own certificate
    own = NodeLink(cluster.addresses["b"], "b", owner_files, timeout=10)
    try:
        behind = Step(SESSION, 0, 10, 0, b"{}\n", token)
        with pytest.raises(ControlError) as caught:
            own.call("replicate", step=behind.to_message())
        assert caught.value.code == "not_continuing"  # the copy's own checks, as before
    finally:
        own.close()
    client_files: TlsFiles = cluster.certs.issue("app", Role.CLIENT)
    client = NodeLink(cluster.addresses["b"], "b", client_files, timeout=10)
    try:
        with pytest.raises(ControlError) as caught:
            client.call("replicate", step=stale.to_message())
        assert caught.value.code == "forbidden"
    finally:
        client.close()
    assert copy_log.read_bytes() == held
    assert cluster.ask("send k2")["ok"] is True  # the owner ships on
    assert cluster.copy_keys("b") == ["k1", "k2"]
