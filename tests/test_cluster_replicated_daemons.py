"""``loopd create --cluster URL ID --replicas 3`` on three real daemons with TLS ports.

The owner's worker ships every group commit to the two followers' TLS ports before it
answers; etcd holds the followers and the in-sync set. Every process of the owner's
node SIGKILLed right after an acknowledgement: each follower's copy, read from its
disk, holds every acknowledged key once. A follower SIGKILLed: etcd's in-sync set
loses it before the next acknowledgement; the second one too: writes are refused in
one line until one is back, and it rejoins once restarted.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from supervisor.client.cluster import ClusterClient
from supervisor.cluster.errors import ClusterError
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.ownership import owner_of
from supervisor.cluster.replica_set import ReplicaSet, replicas_of
from supervisor.cluster.transport import Role
from supervisor.errors import ControlError
from tests.etcd_server import EtcdServer, free_port
from tests.support import Daemon, log_user_keys, loopd, poll_until
from tests.tls_certs import Certificates
from worker import Session, SessionLocked, User
from worker.store.loader import load_session

pytestmark = pytest.mark.timeout(100)
NAMES = ("a", "b", "c")
T = "2026-12-01T20:00:00.000000Z"


@dataclass
class Nodes:
    root: Path
    etcd: EtcdServer
    certs: Certificates
    addresses: dict[str, str]
    daemons: dict[str, Daemon]

    def start(self, name: str) -> Daemon:
        files = self.certs.issue(name, Role.NODE)
        args = ["--cluster", self.etcd.url, "--node", name, "--lease-ttl", "3"]
        args += ["--listen", self.addresses[name], *self.certs.args(files)]
        home = self.root / name
        home.mkdir(parents=True, exist_ok=True)
        # The node's default for creates that do not say (the first test says it).
        (home / "loopd.toml").write_text("replicas = 3\n")
        self.daemons[name] = Daemon(home, *args)
        return self.daemons[name]

    def kill(self, name: str) -> None:
        """SIGKILL every process of the node: its workers and its daemon."""
        daemon = self.daemons[name]
        workers = daemon.workers()
        for proc in workers:
            proc.send_signal(signal.SIGKILL)
        daemon.proc.send_signal(signal.SIGKILL)
        daemon.stop()

    def client(self) -> ClusterClient:
        return ClusterClient(self.etcd.url, timeout=20, tls=self.certs.issue("app", Role.CLIENT))

    def replica_set(self) -> ReplicaSet | None:
        with EtcdClient(self.etcd.url) as etcd:
            return replicas_of(etcd, "r")

    def owner(self) -> str:
        with EtcdClient(self.etcd.url) as etcd:
            owner = owner_of(etcd, "r")
        assert owner is not None
        return owner.node

    def copy_keys(self, name: str) -> list[str | None]:
        copies = self.root / name / "replicas"
        load_session(str(copies / "sessions" / "r"), "r", history=True)
        return log_user_keys(copies, "r")


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    root = tmp_path / "rd"
    root.mkdir()
    etcd = EtcdServer(root / "etcd")
    etcd.start()
    addresses = {name: f"tls://127.0.0.1:{free_port()}" for name in NAMES}
    cluster = Nodes(root, etcd, Certificates(root / "certs"), addresses, {})
    try:
        for name in NAMES:
            cluster.start(name)
        yield cluster
    finally:
        for daemon in cluster.daemons.values():
            daemon.stop()
        etcd.stop()


def test_every_acknowledged_key_is_on_the_followers_when_the_owner_node_dies(
    nodes: Nodes,
) -> None:
    files = nodes.certs.issue("app", Role.CLIENT)
    env = {"LOOPD_TLS_CA": files.ca, "LOOPD_TLS_CERT": files.cert, "LOOPD_TLS_KEY": files.key}
    created = loopd("create", "--cluster", nodes.etcd.url, "r", "--replicas", "3", env=env)
    assert created.returncode == 0, created.stderr
    owner = nodes.owner()
    followers = tuple(n for n in NAMES if n != owner)
    current = nodes.replica_set()
    assert current is not None
    assert (current.replicas, current.followers, current.in_sync) == (3, followers, followers)
    shown = loopd("status", "--cluster", nodes.etcd.url, env=env)
    assert shown.returncode == 0, shown.stderr
    header, row = shown.stdout.splitlines()
    assert header.split()[:4] == ["session", "node", "followers", "in_sync"]
    assert row.split()[:4] == ["r", owner, ",".join(followers), ",".join(followers)]
    with nodes.client() as client:
        acknowledged = []
        for n in range(5):
            reply = client.send("r", f"text {n}", key=f"k{n}")
            assert reply["text"] == f"echo: text {n}"
            acknowledged.append(f"k{n}")
        nodes.kill(owner)  # right after the last acknowledgement
    for name in followers:
        assert nodes.copy_keys(name) == acknowledged


def test_a_follower_killed_leaves_the_in_sync_set_before_the_next_ack(nodes: Nodes) -> None:
    with nodes.client() as client:
        client.create("r")  # loopd.toml's replicas = 3: 2 copies must be in sync
        owner = nodes.owner()
        first, second = (n for n in NAMES if n != owner)
        client.send("r", "one", key="k1")
        nodes.kill(first)
        client.send("r", "two", key="k2")  # acknowledged: the owner and second have it
        current = nodes.replica_set()  # read after the reply: etcd changed before it
        assert current is not None
        assert current.in_sync == (second,)
        nodes.kill(second)
        with pytest.raises(ControlError) as caught:
            # Durable on the owner only, not acknowledged; the client's retries by key
            # are then refused before a byte is written.
            client.send("r", "three", key="k3")
        message = str(caught.value)
        assert "1 of its 3 copies are in sync, 2 are needed" in message
        assert "\n" not in message
        nodes.start(first)  # back: the owner catches it up at its next write

        def written() -> bool:
            try:
                client.send("r", "four", key="k4")
            except ControlError:
                return False
            return True

        poll_until(written, timeout=30, what=f"a write acknowledged with {first} back")
        current = nodes.replica_set()
        assert current is not None
        assert current.in_sync == (first,)
    assert nodes.copy_keys(first) == ["k1", "k2", "k3", "k4"]
    assert nodes.copy_keys(second) == ["k1", "k2"]


def test_the_owner_node_dies_a_follower_takes_over_and_the_old_owner_rejoins(
    nodes: Nodes,
) -> None:
    """The old owner returns with a line it made durable but never had acknowledged (a
    write in flight at the kill, appended to its copy while it was down): its copy is a
    follower's now, the same log file (never copied again from nothing), cut back to the
    prefix the new owner's log shares, the line in quarantine (never deleted)."""
    with nodes.client() as client:
        client.create("r")  # 3 copies, loopd.toml's default
        owner = nodes.owner()
        for n in range(4):
            assert client.send("r", f"t{n}", key=f"k{n}")["duplicate"] is False
        nodes.kill(owner)  # every process of the owner's node
        home = nodes.root / owner
        old = poll_until(lambda: _opened(home), what="the killed worker's lock released")
        with old:  # durable on the old owner only
            old.append(User(time=T, text="never acknowledged", key="lost"))
            old_log = Path(old.log_path)
        inode = old_log.stat().st_ino

        def served() -> dict[str, object] | None:
            try:
                return client.send("r", "after", key="k4")
            except (ControlError, ClusterError):  # nobody owns it yet, or not served yet
                return None

        assert poll_until(served, timeout=30, what="the session served again")["duplicate"] is False
        successor = nodes.owner()
        assert successor != owner
        for n in range(4):  # every acknowledged key is there, once: its retry is answered
            assert client.send("r", f"t{n}", key=f"k{n}")["duplicate"] is True
        current = nodes.replica_set()
        assert current is not None
        assert owner in current.followers
        assert owner not in current.in_sync
        nodes.start(owner)  # its old copy becomes a follower's, caught up from there

        def rejoined() -> bool:
            client.send("r", "more", key=f"m{poll_round()}")  # the owner catches it up
            now = nodes.replica_set()
            return now is not None and owner in now.in_sync

        poll_until(rejoined, timeout=30, what=f"{owner} back in the in-sync set")
    assert not (home / "sessions" / "r").exists()  # a follower's copy now
    assert not list((home / "quarantine").glob("r.*"))  # not set aside whole
    copy_log = home / "replicas" / "sessions" / "r" / old_log.name
    assert copy_log.stat().st_ino == inode  # the old owner's own log, kept and continued
    suffix = list((home / "replicas" / "quarantine" / "r").glob("*.unacknowledged"))
    assert len(suffix) == 1
    assert b'"lost"' in suffix[0].read_bytes()
    keys = nodes.copy_keys(owner)
    assert keys[:5] == ["k0", "k1", "k2", "k3", "k4"]
    assert "lost" not in keys
    assert len(keys) == len(set(keys))


def _opened(home: Path) -> Session | None:
    try:
        return Session.open(home, "r")
    except SessionLocked:  # the SIGKILLed worker is not reaped yet
        return None


_ROUNDS = iter(range(10**6))


def poll_round() -> int:
    return next(_ROUNDS)
