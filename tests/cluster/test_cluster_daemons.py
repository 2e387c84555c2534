"""``loopd serve --cluster``: real daemons as nodes, requests routed through etcd."""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.client import Client, call
from supervisor.client.cluster import ClusterClient, home_of
from supervisor.cluster.errors import ClusterError, StaleOwner
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import PREFIX
from supervisor.cluster.ownership import owner_of
from supervisor.cluster.routing import route
from supervisor.errors import ControlError
from tests.harness.etcd_server import EtcdServer
from tests.harness.support import Daemon, loopd, poll_until, stop
from worker.store.disk.layout import session_dir
from worker.store.loader import load_session

SESSIONS = 12


@pytest.fixture
def daemons(etcd: EtcdServer, tmp_path: Path) -> Iterator[dict[str, Daemon]]:
    started: dict[str, Daemon] = {}
    try:
        for name in ("a", "b", "c"):
            started[name] = Daemon(
                tmp_path / name, "--cluster", etcd.url, "--node", name, "--lease-ttl", "3"
            )
        yield started
    finally:
        for daemon in started.values():
            daemon.stop()


def test_sessions_created_through_the_cluster_have_one_owner_and_answer_with_its_token(
    etcd: EtcdServer, daemons: dict[str, Daemon]
) -> None:
    with ClusterClient(etcd.url, timeout=20) as cluster:
        for n in range(SESSIONS):
            cluster.create(f"s{n}")
        for n in range(SESSIONS):
            reply = cluster.send(f"s{n}", "hello", key=f"k{n}")
            again = cluster.send(f"s{n}", "hello", key=f"k{n}")
            assert reply["duplicate"] is False
            assert again["duplicate"] is True
            assert reply["token"] == again["token"]
    with EtcdClient(etcd.url) as client:
        assert len(client.range(f"{PREFIX}owner/", prefix=True)) == SESSIONS
        for n in range(SESSIONS):
            owner = owner_of(client, f"s{n}")
            assert owner is not None
            holders = [
                name
                for name, daemon in daemons.items()
                if Path(session_dir(daemon.home, f"s{n}")).is_dir()
            ]
            assert holders == [owner.node]
            state = load_session(session_dir(daemons[owner.node].home, f"s{n}"), f"s{n}")
            assert state.fence.token == owner.token  # read without the worker's lock
    counts = {name: len(list((d.home / "sessions").iterdir())) for name, d in daemons.items()}
    assert counts == {"a": 4, "b": 4, "c": 4}


def test_a_session_id_is_created_once_cluster_wide(
    etcd: EtcdServer, daemons: dict[str, Daemon]
) -> None:
    with ClusterClient(etcd.url, timeout=20) as cluster:
        cluster.create("only")
        for daemon in daemons.values():
            with pytest.raises(ControlError, match="already exists"):
                call(str(daemon.home), "create", session="only")


def test_the_cli_routes_send_and_status_through_the_cluster(
    etcd: EtcdServer, daemons: dict[str, Daemon]
) -> None:
    created = loopd("create", "s1", "--cluster", etcd.url)
    assert created.returncode == 0, created.stderr
    sent = loopd("send", "s1", "hi", "--key", "k1", "--cluster", etcd.url)
    assert sent.returncode == 0, sent.stderr
    reply = json.loads(sent.stdout)
    assert reply["duplicate"] is False
    assert isinstance(reply["token"], int)
    status = loopd("status", "--json", "--cluster", etcd.url)
    assert status.returncode == 0, status.stderr
    rows = json.loads(status.stdout)
    assert [(r["session"], r["node"]) for r in rows] == [("s1", "a")]


def test_a_daemon_stops_acknowledging_while_etcd_is_down_and_resumes(
    etcd: EtcdServer, daemons: dict[str, Daemon]
) -> None:
    with ClusterClient(etcd.url, timeout=20) as cluster:
        cluster.create("s1")
        assert cluster.send("s1", "before", key="k1")["duplicate"] is False
        with EtcdClient(etcd.url) as client:
            home = home_of(route(client, "s1").address)
        with Client(home, timeout=10, retry_for=0.1) as direct:
            etcd.stop()

            def refused() -> str | None:
                try:
                    direct.send("s1", "probe", key="probe")
                except ControlError as exc:
                    return exc.code
                return None

            assert poll_until(refused, timeout=6, what="a refusal") == "not_owner"
            etcd.start()

            def accepted() -> bool:
                try:
                    direct.send("s1", "after", key="k2")
                except ControlError:
                    return False
                return True

            poll_until(accepted, timeout=15, what="writes again")


def test_loopd_move_between_daemons_keeps_every_key_and_the_client_follows_the_session(
    etcd: EtcdServer, daemons: dict[str, Daemon]
) -> None:
    with ClusterClient(etcd.url, timeout=20) as cluster:
        cluster.create("s1")  # on a: every node holds none yet
        first = cluster.send("s1", "one", key="k1")
        moved = loopd("move", "s1", "--to", "b", "--cluster", etcd.url)
        assert moved.returncode == 0, moved.stderr
        token = json.loads(moved.stdout)["token"]
        assert token > first["token"]
        second = cluster.send("s1", "two", key="k2")  # rerouted: a answers not_owner
        assert second["token"] == token
        assert cluster.send("s1", "one", key="k1")["duplicate"] is True
    assert not Path(session_dir(daemons["a"].home, "s1")).exists()
    state = load_session(session_dir(daemons["b"].home, "s1"), "s1")
    assert sorted(state.keys) == ["k1", "k2"]  # each applied once, across the move
    assert (state.fence.node, state.fence.token) == ("b", token)
    status = loopd("status", "--json", "--cluster", etcd.url)
    assert [(r["session"], r["node"]) for r in json.loads(status.stdout)] == [("s1", "b")]


def test_a_paused_daemon_acknowledges_nothing_after_a_takeover_and_quarantines_its_copy(
    etcd: EtcdServer, daemons: dict[str, Daemon], tmp_path: Path
) -> None:
    a = daemons["a"]
    with ClusterClient(etcd.url, timeout=20) as cluster, Client(str(a.home), timeout=5) as direct:
        cluster.create("s1")  # on a
        token_a = cluster.send("s1", "one", key="k1")["token"]
        assert isinstance(token_a, int)
        assert direct.send("s1", "two", key="k2")["token"] == token_a  # a link to a's worker
        stop(a.proc)  # the daemon and its keepalive; not its worker
        try:
            with EtcdClient(etcd.url) as client:
                poll_until(lambda: owner_of(client, "s1") is None, timeout=10, what="expiry")
            with pytest.raises(ControlError, match="not_owner"):
                direct.send("s1", "three", key="k3")  # the worker's lease deadline passed
            backup = tmp_path / "backup"
            shutil.copytree(session_dir(a.home, "s1"), backup)
            taken = loopd(
                "takeover", "s1", "--from-copy", str(backup), "--to", "b", "--cluster", etcd.url
            )
            assert taken.returncode == 0, taken.stderr
            token_b = json.loads(taken.stdout)["token"]
            assert cluster.send("s1", "four", key="k4")["token"] == token_b
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        with pytest.raises(StaleOwner):
            cluster.guard.check("s1", token_a)  # a late reply of a's would be refused
        poll_until(
            lambda: not Path(session_dir(a.home, "s1")).exists(), timeout=15, what="quarantine"
        )
        assert len(list((a.home / "quarantine").iterdir())) == 1
        with pytest.raises(ControlError):  # not_owner, or unavailable once its worker stops
            direct.send("s1", "five", key="k5")
    state = load_session(session_dir(daemons["b"].home, "s1"), "s1")
    assert sorted(state.keys) == ["k1", "k2", "k4"]


def test_after_its_lease_was_lost_a_daemon_claims_its_sessions_again_with_higher_tokens(
    etcd: EtcdServer, daemons: dict[str, Daemon]
) -> None:
    with ClusterClient(etcd.url, timeout=20) as cluster, EtcdClient(etcd.url) as client:
        cluster.create("s1")  # on a
        token = cluster.send("s1", "one", key="k1")["token"]
        assert isinstance(token, int)
        stop(daemons["a"].proc)  # its keepalive stops: the lease expires
        try:
            poll_until(lambda: owner_of(client, "s1") is None, timeout=10, what="expiry")
        finally:
            os.kill(daemons["a"].proc.pid, signal.SIGCONT)

        def served_again() -> int | None:
            try:
                reply = cluster.send("s1", "two", key="k2")
            except (ControlError, ClusterError):
                return None
            new = reply["token"]
            return new if isinstance(new, int) else None

        assert poll_until(served_again, timeout=20, what="a new token") > token
    state = load_session(session_dir(daemons["a"].home, "s1"), "s1")
    assert sorted(state.keys) == ["k1", "k2"]
