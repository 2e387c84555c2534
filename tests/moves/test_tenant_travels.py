"""A session's tenant travels with it: through ``loopd move`` between nodes, and through
``loopd backup`` and ``loopd restore`` (docs/operations.md, "Tenants").

Each test is hostile in the same way: had the tenant stayed behind, the session would
be the operator's where it arrived, and its own tenant would be refused it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from supervisor.cli.cluster_commands import DaemonControl, RemoteNodes
from supervisor.client import call
from supervisor.client.cluster import ClusterClient
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.peer_link import NodeLink
from supervisor.cluster.transport import Role, TlsFiles
from supervisor.errors import ControlError
from supervisor.moves.move import move_session
from supervisor.moves.remote_move import move_remote
from tests.harness.etcd_server import EtcdServer, free_port
from tests.harness.support import Daemon, loopd, running_daemon
from tests.harness.tls_certs import Certificates

pytestmark = pytest.mark.timeout(180)


def _ok(*args: str) -> str:
    done = loopd(*args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def _refused(home: Path, tenant: str, session: str) -> ControlError:
    with pytest.raises(ControlError) as caught:
        call(str(home), "status", session=session, tenant=tenant)
    assert caught.value.code == "forbidden", caught.value
    return caught.value


# -- backup and restore ---------------------------------------------------------------------


def test_a_restore_into_the_same_home_gives_the_session_back_to_its_tenant(
    tmp_path: Path,
) -> None:
    home, dest = tmp_path / "home", tmp_path / "backups"
    with running_daemon(home):
        call(str(home), "create", session="s1", tenant="acme")
        call(str(home), "send", session="s1", text="hi", key="k1", tenant="acme")
        _ok("backup", "--home", str(home), "s1", str(dest))
        manifest = json.loads((dest / "s1" / "loopd-backup.json").read_text())
        assert manifest["tenant"] == "acme"
        _ok("delete", "--home", str(home), "s1")  # forgotten: its tenant file goes too
        assert not (home / "tenants" / "s1").exists()
        said = _ok("restore", "--home", str(home), str(dest / "s1"))
        assert "tenant 'acme'" in said
        assert (home / "tenants" / "s1").read_text() == "acme\n"
        assert call(str(home), "status", session="s1", tenant="acme")
        assert str(_refused(home, "globex", "s1")) == str(_refused(home, "globex", "zz9"))


def test_a_restore_into_another_home_is_the_operators_unless_told_the_tenant(
    tmp_path: Path,
) -> None:
    home, dest = tmp_path / "home", tmp_path / "backups"
    with running_daemon(home):
        call(str(home), "create", session="s1", tenant="acme")
        _ok("backup", "--home", str(home), "s1", str(dest))
    other, third = tmp_path / "other", tmp_path / "third"
    for made in (other, third):
        (made / "sessions").mkdir(mode=0o700, parents=True)
    said = _ok("restore", "--home", str(other), str(dest / "s1"))
    assert "--tenant acme gives it to that tenant here" in said
    assert not (other / "tenants" / "s1").exists()
    with running_daemon(other):
        _refused(other, "acme", "s1")  # the name may be someone else's here
    _ok("restore", "--home", str(third), "--tenant", "acme", str(dest / "s1"))
    assert (third / "tenants" / "s1").read_text() == "acme\n"
    with running_daemon(third):
        assert call(str(third), "status", session="s1", tenant="acme")


def test_a_backup_of_before_tenants_is_restored_as_the_operators(tmp_path: Path) -> None:
    home, dest = tmp_path / "home", tmp_path / "backups"
    with running_daemon(home):
        call(str(home), "create", session="s1", tenant="acme")
        _ok("backup", "--home", str(home), "s1", str(dest))
        _ok("delete", "--home", str(home), "s1")
    written = dest / "s1" / "loopd-backup.json"
    manifest = json.loads(written.read_text())
    del manifest["tenant"], manifest["home"]  # as an older loopd wrote it
    written.write_text(json.dumps(manifest))
    _ok("restore", "--home", str(home), str(dest / "s1"))
    assert not (home / "tenants" / "s1").exists()


# -- loopd move --------------------------------------------------------------------------


@dataclass
class Pair:
    etcd: EtcdServer
    a: Daemon
    b: Daemon
    addresses: dict[str, str]
    acme: TlsFiles
    globex: TlsFiles
    operator: TlsFiles

    def link(self, node: str, files: TlsFiles) -> NodeLink:
        return NodeLink(self.addresses[node], node, files, timeout=20)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    certs = Certificates(tmp_path / "certs")
    etcd = EtcdServer(tmp_path / "etcd")
    etcd.start()
    started: list[Daemon] = []
    try:
        addresses = {}
        for name in ("a", "b"):
            addresses[name] = f"tls://127.0.0.1:{free_port()}"
            args = ["--cluster", etcd.url, "--node", name, "--listen", addresses[name]]
            started.append(
                Daemon(tmp_path / name, *args, *certs.args(certs.issue(name, Role.NODE)))
            )
        yield Pair(
            etcd, started[0], started[1], addresses,
            certs.issue_tenant("acme-app", Role.CLIENT, "acme"),
            certs.issue_tenant("globex-app", Role.CLIENT, "globex"),
            certs.issue_tenant("alice", Role.OPERATOR, "ops"),
        )  # fmt: skip
    finally:
        for daemon in started:
            daemon.stop()
        etcd.stop()


def _local(client: EtcdClient, pair: Pair) -> None:
    move_session(client, "m1", "b", control=DaemonControl())


def _remote(client: EtcdClient, pair: Pair) -> None:
    nodes = RemoteNodes(client, pair.operator)
    try:
        move_remote(client, "m1", "b", nodes)
    finally:
        nodes.close()


@pytest.mark.parametrize(
    "mover",
    [pytest.param(_local, id="homes-shared"), pytest.param(_remote, id="pulled-over-tls")],
)
def test_a_moved_session_stays_its_tenants_on_the_new_node(
    pair: Pair, mover: Callable[[EtcdClient, Pair], None]
) -> None:
    link = pair.link("a", pair.acme)
    try:
        link.call("create", session="m1")
        link.call("send", session="m1", text="before", key="k1")
    finally:
        link.close()
    with EtcdClient(pair.etcd.url) as client:
        mover(client, pair)
    assert (pair.b.home / "tenants" / "m1").read_text() == "acme\n"
    with ClusterClient(pair.etcd.url, timeout=20, tls=pair.acme) as acme:
        assert acme.send("m1", "after", key="k2")["text"] == "echo: after"
    link = pair.link("b", pair.globex)
    try:
        refusals = []
        for session in ("m1", "zz9"):
            with pytest.raises(ControlError) as caught:
                link.call("status", session=session)
            refusals.append(str(caught.value))
    finally:
        link.close()
    assert refusals[0] == refusals[1]
    assert "forbidden" in refusals[0]
