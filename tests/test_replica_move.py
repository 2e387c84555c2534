"""``loopd move`` of a replicated session, one replica at a time, on real daemons.

Four daemons with TLS ports and a real etcd; a session of 3 copies. While the move
runs a thread reads etcd as fast as it can: the copies in sync (the owner's and the
in-sync followers') never drop below 3.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.client.cluster import ClusterClient
from supervisor.cluster.errors import ClusterError
from supervisor.cluster.replica_move import ReplicaStep
from supervisor.errors import ControlError
from tests.replica_nodes import NAMES, InSyncWatch, Nodes, running_nodes
from tests.support import loopd, poll_until

pytestmark = pytest.mark.timeout(100)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    with running_nodes(tmp_path / "rm") as cluster:
        yield cluster


def _write_keys(client: ClusterClient, keys: range) -> None:
    for n in keys:
        assert client.send("r", f"t{n}", key=f"k{n}")["duplicate"] is False


def _every_key_once(client: ClusterClient, keys: range, token: int) -> None:
    for n in keys:
        reply = client.send("r", f"t{n}", key=f"k{n}")
        assert reply["duplicate"] is True
        answered_with = reply["token"]
        assert isinstance(answered_with, int)
        assert answered_with > token


def test_a_move_to_an_in_sync_follower_hands_the_session_over(nodes: Nodes) -> None:
    with nodes.client() as client:
        client.create("r")
        owner, token = nodes.owner()
        target = nodes.replica_set().in_sync[0]
        _write_keys(client, range(5))
        with InSyncWatch(nodes.etcd.url) as watch:
            moved = loopd("move", "--cluster", nodes.etcd.url, "r", "--to", target,
                          env=nodes.operator_env())  # fmt: skip
        assert moved.returncode == 0, moved.stderr
        assert '"node": "' + target + '"' in moved.stdout
        assert watch.reads > 0
        assert watch.fewest == 3
        assert nodes.owner()[0] == target
        assert nodes.owner()[1] > token
        current = nodes.replica_set()
        assert owner in current.followers  # the old owner follows, its copy kept
        _every_key_once(client, range(5), token)
        _write_keys(client, range(5, 7))
        assert owner in nodes.replica_set().in_sync
    # The old owner's copy is a follower's now, caught up by the new owner.
    poll_until(lambda: nodes.copy_keys(owner) == [f"k{n}" for n in range(7)],
               what=f"{owner}'s copy holding every key")  # fmt: skip


@pytest.mark.cluster_sweep  # the drain below takes this path by default (a copy added first)
def test_a_move_to_a_new_node_adds_it_in_sync_before_the_owner_leaves(nodes: Nodes) -> None:
    with nodes.client() as client:
        client.create("r")
        owner, token = nodes.owner()
        followers = nodes.replica_set().followers
        (target,) = (n for n in NAMES if n != owner and n not in followers)
        _write_keys(client, range(4))
        with InSyncWatch(nodes.etcd.url) as watch:
            moved = loopd("move", "--cluster", nodes.etcd.url, "r", "--to", target,
                          env=nodes.operator_env())  # fmt: skip
        assert moved.returncode == 0, moved.stderr
        assert watch.reads > 0
        assert watch.fewest == 3
        assert nodes.owner()[0] == target
        current = nodes.replica_set()
        assert sorted(current.followers) == sorted(followers)  # the old owner left
        assert sorted(current.in_sync) == sorted(followers)
        assert not (nodes.root / owner / "sessions" / "r").exists()
        _every_key_once(client, range(4), token)
        _write_keys(client, range(4, 6))
    for name in followers:
        assert nodes.copy_keys(name) == [f"k{n}" for n in range(6)]


def _served(client: ClusterClient, key: str) -> dict[str, object] | None:
    try:
        return client.send("r", "probe", key=key)
    except (ControlError, ClusterError):  # not served yet (its worker stopped, or moving)
        return None


@pytest.mark.parametrize(
    "step",
    [
        pytest.param(ReplicaStep.OWN, id="own"),
        *(pytest.param(step, id=step.value, marks=pytest.mark.cluster_sweep)
          for step in (ReplicaStep.INTENT, ReplicaStep.STOP, ReplicaStep.DEMOTE,
                       ReplicaStep.RELEASE, ReplicaStep.PROMOTE, ReplicaStep.DONE)),
    ],
)  # fmt: skip
def test_a_mover_killed_at_a_step_leaves_the_session_whole_and_a_rerun_finishes(
    nodes: Nodes, step: ReplicaStep
) -> None:
    env = nodes.operator_env()
    with nodes.client() as client:
        client.create("r")
        owner, token = nodes.owner()
        target = nodes.replica_set().in_sync[0]
        _write_keys(client, range(4))
        killed = subprocess.run(
            [sys.executable, "-m", "tests.replica_mover", nodes.etcd.url, "r", target, step.value],
            capture_output=True, text=True, timeout=60, env={**os.environ, **env}, check=False,
        )  # fmt: skip
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert 1 + len(nodes.replica_set().in_sync) == 3  # no copy left the in-sync set
        if step in (ReplicaStep.RELEASE, ReplicaStep.PROMOTE, ReplicaStep.DONE):
            # Handed over in etcd: the target's failover watch serves it, no rerun needed.
            poll_until(lambda: _served(client, "k-before"), what="served before a rerun")
            assert nodes.owner()[0] == target
        moved = loopd("move", "--cluster", nodes.etcd.url, "r", "--to", target, env=env)
        assert moved.returncode == 0, moved.stderr
        assert nodes.owner()[0] == target
        reply = poll_until(lambda: _served(client, "k-after"), what="the session served")
        assert reply["duplicate"] is False
        _every_key_once(client, range(4), token)
        current = nodes.replica_set()
        assert owner in current.followers
        assert 1 + len(current.in_sync) == 3
    keys = ["k0", "k1", "k2", "k3", "k-after"]
    if step in (ReplicaStep.RELEASE, ReplicaStep.PROMOTE, ReplicaStep.DONE):
        keys.insert(4, "k-before")
    poll_until(lambda: nodes.copy_keys(owner) == keys, what=f"{owner}'s copy caught up")


def test_a_drain_moves_each_copy_only_once_another_is_in_sync(nodes: Nodes) -> None:
    env = nodes.operator_env()
    url = nodes.etcd.url
    with nodes.client() as client:
        client.create("r")
        owner, token = nodes.owner()
        before = nodes.replica_set()
        (spare,) = (n for n in NAMES if n != owner and n not in before.followers)
        _write_keys(client, range(3))
        with InSyncWatch(url) as watch:  # the owner's node: handed over, a copy added first
            drained = loopd("drain", "--cluster", url, owner, env=env)
        assert drained.returncode == 0, drained.stderr
        assert watch.fewest == 3
        successor = nodes.owner()[0]
        assert successor in before.followers
        current = nodes.replica_set()
        assert sorted([successor, *current.followers]) == sorted([*before.followers, spare])
        assert 1 + len(current.in_sync) == 3
        _every_key_once(client, range(3), token)
        # A follower's node, with no node left to take its copy: refused in one line.
        follower = current.followers[0]
        refused = loopd("drain", "--cluster", url, follower, env=env)
        assert refused.returncode == 1
        (line,) = refused.stderr.splitlines()
        assert line.startswith("loopd drain: session r: ")
        assert nodes.replica_set().followers == current.followers  # nothing changed
        assert loopd("uncordon", "--cluster", url, owner, env=env).returncode == 0
        with InSyncWatch(url) as watch:  # now the old owner's node takes the copy
            drained = loopd("drain", "--cluster", url, follower, env=env)
        assert drained.returncode == 0, drained.stderr
        assert json.loads(drained.stdout) == {"session": "r", "follower": owner, "from": follower}
        assert watch.fewest == 3
        after = nodes.replica_set()
        assert sorted(after.followers) == sorted([*current.followers[1:], owner])
        assert sorted(after.in_sync) == sorted(after.followers)
        _write_keys(client, range(3, 4))
    poll_until(lambda: nodes.copy_keys(owner) == ["k0", "k1", "k2", "k3"],
               what=f"{owner}'s new copy holding every key")  # fmt: skip


@pytest.mark.cluster_sweep
def test_a_follower_move_adds_the_new_copy_in_sync_before_the_old_one_leaves(
    nodes: Nodes,
) -> None:
    env = nodes.operator_env()
    with nodes.client() as client:
        client.create("r")
        owner, _token = nodes.owner()
        before = nodes.replica_set()
        source = before.followers[0]
        (spare,) = (n for n in NAMES if n != owner and n not in before.followers)
        _write_keys(client, range(3))
        with InSyncWatch(nodes.etcd.url) as watch:
            moved = loopd("move", "--cluster", nodes.etcd.url, "r", "--follower", source,
                          "--to", spare, env=env)  # fmt: skip
        assert moved.returncode == 0, moved.stderr
        assert json.loads(moved.stdout) == {"session": "r", "follower": spare, "from": source}
        assert watch.fewest == 3
        after = nodes.replica_set()
        assert sorted(after.followers) == sorted([*before.followers[1:], spare])
        assert sorted(after.in_sync) == sorted(after.followers)
        assert nodes.owner()[0] == owner
        _write_keys(client, range(3, 5))
    assert nodes.copy_keys(spare) == [f"k{n}" for n in range(5)]
    assert not (nodes.root / source / "replicas" / "sessions" / "r").exists()
    assert list((nodes.root / source / "replicas" / "quarantine").iterdir())  # kept, set aside


@pytest.mark.cluster_sweep
def test_an_interrupted_handover_aborted_is_served_by_the_old_owner_again(nodes: Nodes) -> None:
    env = nodes.operator_env()
    with nodes.client() as client:
        client.create("r")
        owner, token = nodes.owner()
        before = nodes.replica_set()
        _write_keys(client, range(3))
        killed = subprocess.run(  # killed with the old owner's copy demoted, before `own`
            [sys.executable, "-m", "tests.replica_mover", nodes.etcd.url, "r",
             before.in_sync[0], ReplicaStep.OWN.value],
            capture_output=True, text=True, timeout=60, env={**os.environ, **env}, check=False,
        )  # fmt: skip
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert (nodes.root / owner / "replicas" / "sessions" / "r").is_dir()
        aborted = loopd("move", "--cluster", nodes.etcd.url, "r", "--abort", env=env)
        assert aborted.returncode == 0, aborted.stderr
        assert json.loads(aborted.stdout)["node"] == owner
        assert nodes.owner()[0] == owner
        assert nodes.owner()[1] > token
        assert nodes.replica_set().followers == before.followers
        # The move's stop is no operator's: a restart of the old owner serves it again.
        intent = json.loads((nodes.root / owner / "intent.json").read_text())
        assert "r" not in intent["stopped"]
        for n in range(3):
            assert client.send("r", f"t{n}", key=f"k{n}")["duplicate"] is True
        _write_keys(client, range(3, 4))
    for name in before.followers:
        assert nodes.copy_keys(name) == ["k0", "k1", "k2", "k3"]


@pytest.mark.cluster_sweep
def test_the_old_owner_node_killed_mid_handover_leaves_it_to_the_target(nodes: Nodes) -> None:
    env = nodes.operator_env()
    with nodes.client() as client:
        client.create("r")
        owner, token = nodes.owner()
        target = nodes.replica_set().in_sync[0]
        _write_keys(client, range(3))
        killed = subprocess.run(  # the owner's worker stopped, its copy not demoted yet
            [sys.executable, "-m", "tests.replica_mover", nodes.etcd.url, "r", target,
             ReplicaStep.DEMOTE.value],
            capture_output=True, text=True, timeout=60, env={**os.environ, **env}, check=False,
        )  # fmt: skip
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        nodes.kill(owner)  # every process of the old owner's node
        moved = loopd("move", "--cluster", nodes.etcd.url, "r", "--to", target, env=env)
        assert moved.returncode == 0, moved.stderr
        assert nodes.owner()[0] == target
        current = nodes.replica_set()
        assert owner in current.followers
        assert owner not in current.in_sync  # its copy went with its node: out of sync
        _every_key_once(client, range(3), token)
        _write_keys(client, range(3, 4))
    for name in current.in_sync:
        assert nodes.copy_keys(name) == ["k0", "k1", "k2", "k3"]


def test_a_large_session_gets_its_new_copy_while_it_takes_writes(nodes: Nodes) -> None:
    """A follower move of a session of several MB: the new copy is caught up between the
    owner's batches, a slice at a time (``worker.catch_up``), while a client's writes go
    on and are acknowledged; the move ends once it is in sync, and it holds every key."""
    env = nodes.operator_env()
    with nodes.client() as client:
        client.create("r")
        before = nodes.replica_set()
        source = before.followers[0]
        (spare,) = (n for n in NAMES if n != nodes.owner()[0] and n not in before.followers)
        big = "x" * 200_000
        for n in range(20):  # about 8 MB of log: a User and its echo each
            assert client.send("r", big, key=f"big{n}")["duplicate"] is False
        mover = subprocess.Popen(
            [sys.executable, "-m", "supervisor", "move", "--cluster", nodes.etcd.url, "r",
             "--follower", source, "--to", spare],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **env},
        )  # fmt: skip
        try:
            during: list[str] = []
            while mover.poll() is None and len(during) < 500:
                key = f"d{len(during)}"
                assert client.send("r", "t", key=key)["duplicate"] is False
                during.append(key)
            out, err = mover.communicate(timeout=60)
        finally:
            if mover.poll() is None:
                mover.kill()
                mover.wait()
        assert mover.returncode == 0, err
        assert json.loads(out) == {"session": "r", "follower": spare, "from": source}
        assert during  # writes were taken while the copy was added
        after = nodes.replica_set()
        assert spare in after.in_sync
        assert client.send("r", "t", key="after")["duplicate"] is False
    keys = [f"big{n}" for n in range(20)] + during + ["after"]
    poll_until(lambda: nodes.copy_keys(spare) == keys, what=f"{spare}'s copy holding every key")
