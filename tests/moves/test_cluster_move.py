"""Moving a session between nodes under keyed writes, with a SIGKILL of the mover at every step."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.cases import CaseResult
from chaos.oracle.oracle import ClientLog, check_after_fault, check_final, snapshot_logs
from chaos.scenarios.scenarios import SESSION, Scenario
from supervisor.cluster.errors import MoveFailed
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import move_key
from supervisor.cluster.ownership import owner_of, placement_of
from supervisor.moves.move import MoveStep, abort_move, move_session
from tests.harness.cluster_support import Node, create_session, register, send, try_send, writers
from tests.harness.etcd_server import EtcdServer
from worker import LogSealed, Session
from worker.store.disk.layout import session_dir


@pytest.fixture
def client(etcd: EtcdServer) -> Iterator[EtcdClient]:
    with EtcdClient(etcd.url) as client:
        yield client


@pytest.fixture
def nodes(client: EtcdClient, tmp_path: Path) -> Iterator[list[Node]]:
    registered = [register(client, name, tmp_path / name) for name in ("a", "b")]
    yield registered
    for node in registered:
        node.lease.close()


def _load(nodes: list[Node], log: ClientLog, keys: list[str]) -> None:
    """Send keyed requests to the node that takes writes, recording what was acknowledged."""
    for key in keys:
        log.start(key)
        for node in nodes:
            if try_send(node.home, SESSION, key):
                log.ack(key, 0)
                break


def test_a_move_carries_every_acknowledged_key_to_the_target_with_a_higher_token(
    client: EtcdClient, nodes: list[Node]
) -> None:
    a, b = nodes
    token = create_session(client, a, SESSION)
    for n in range(5):
        send(a.home, SESSION, f"k{n}")
    done = move_session(client, SESSION, "b")
    assert (done.node, done.token > token) == ("b", True)
    assert placement_of(client, SESSION) == "b"
    owner = owner_of(client, SESSION)
    assert owner is not None
    assert (owner.node, owner.token) == ("b", done.token)
    assert not Path(session_dir(a.home, SESSION)).exists()
    assert client.get(move_key(SESSION)) is None
    with Session.open(b.home, SESSION) as moved:
        assert (moved.fence.node, moved.fence.token, moved.fence.sealed) == ("b", done.token, None)
        assert {moved.find_key(f"k{n}") is not None for n in range(5)} == {True}
    assert send(b.home, SESSION, "after")["duplicate"] is False


def test_a_move_to_the_node_that_holds_the_session_changes_nothing(
    client: EtcdClient, nodes: list[Node]
) -> None:
    a, _b = nodes
    token = create_session(client, a, SESSION)
    assert move_session(client, SESSION, "a").token == token
    assert client.get(move_key(SESSION)) is None


def test_a_second_move_to_another_target_is_refused_while_one_is_in_progress(
    client: EtcdClient, nodes: list[Node], tmp_path: Path
) -> None:
    a, _b = nodes
    c = register(client, "c", tmp_path / "c")
    try:
        create_session(client, a, SESSION)
        _kill_mover_before(client, MoveStep.COPY)
        with pytest.raises(MoveFailed, match="a move to b is in progress: rerun with --to b"):
            move_session(client, SESSION, "c")
    finally:
        c.lease.close()


def test_the_source_refuses_writes_once_sealed(client: EtcdClient, nodes: list[Node]) -> None:
    a, _b = nodes
    create_session(client, a, SESSION)
    _kill_mover_before(client, MoveStep.COPY)
    with pytest.raises(LogSealed, match="sealed by Handoff to 'b'"):
        send(a.home, SESSION, "late")


def _kill_mover_before(client: EtcdClient, step: MoveStep | None) -> int:
    args = [sys.executable, "-m", "tests.programs.cluster_mover", client.url, SESSION, "b"]
    if step is not None:
        args.append(step.value)
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    if step is None:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == -9, done.stderr
    return done.returncode


WRITER_AFTER_KILL_BEFORE = {
    MoveStep.INTENT: ["a"],
    MoveStep.SEAL: ["a"],  # the intent is written, the source not sealed yet
    MoveStep.COPY: [],  # sealed: unavailable until the rerun, never forked
    MoveStep.VERIFY: [],
    MoveStep.OWN: [],
    MoveStep.OPEN: ["b"],  # etcd names b; its copy ends with the Handoff to b
    MoveStep.RELEASE: ["b"],
}
"""Who can write after the mover was killed just before each step (docs/scaling.md 6)."""


MOVE_SCENARIO = Scenario(name="cluster-move", ops=(), doc="default-app requests, moved")
"""The oracle's view of these tests: keyed requests of the default app, no store ops."""


@pytest.mark.parametrize("step", list(MoveStep), ids=[s.value for s in MoveStep])
def test_a_mover_killed_before_each_step_leaves_one_writer_and_a_rerun_finishes_the_move(
    client: EtcdClient, nodes: list[Node], step: MoveStep
) -> None:
    a, b = nodes
    create_session(client, a, SESSION)
    log = ClientLog()
    _load(nodes, log, [f"before{n}" for n in range(6)])

    _kill_mover_before(client, step)
    able = writers(client, {n.name: n.home for n in nodes}, SESSION)
    assert able == WRITER_AFTER_KILL_BEFORE[step]
    # The client keeps writing: a sealed source acknowledges nothing.
    _load(nodes, log, ["during0", "during1"])
    home = b.home if able == ["b"] else a.home
    after_fault = snapshot_logs(str(home))
    result = CaseResult(case=f"move:{step.value}", fault="kill", boundary=step.value)
    check_after_fault(result, MOVE_SCENARIO, log, after_fault)

    _kill_mover_before(client, None)  # the rerun
    assert writers(client, {n.name: n.home for n in nodes}, SESSION) == ["b"]
    assert not Path(session_dir(a.home, SESSION)).exists()
    assert client.get(move_key(SESSION)) is None
    # Retries of every key (answered from the log) and new writes, all on the new owner.
    keys = [*sorted(log.acked | log.in_flight), "after0", "after1"]
    _load(nodes, log, keys)
    scenario = Scenario(name="cluster-move", ops=(), doc="", requests=tuple((k, k) for k in keys))
    check_final(result, scenario, log, after_fault, str(b.home))
    assert result.violations == []


@pytest.mark.parametrize("step", [MoveStep.COPY, MoveStep.OWN], ids=["copy", "own"])
def test_an_aborted_move_gives_the_source_a_higher_token_and_removes_the_targets_copy(
    client: EtcdClient, nodes: list[Node], step: MoveStep
) -> None:
    a, b = nodes
    token = create_session(client, a, SESSION)
    send(a.home, SESSION, "k1")
    _kill_mover_before(client, step)
    done = abort_move(client, SESSION)
    assert (done.node, done.token > token) == ("a", True)
    assert client.get(move_key(SESSION)) is None
    assert not Path(session_dir(b.home, SESSION)).exists()
    assert writers(client, {n.name: n.home for n in nodes}, SESSION) == ["a"]
    assert send(a.home, SESSION, "k2")["duplicate"] is False
    with Session.open(a.home, SESSION) as opened:
        assert (opened.fence.node, opened.fence.token) == ("a", done.token)


def test_a_move_cannot_be_aborted_once_the_target_owns_the_session(
    client: EtcdClient, nodes: list[Node]
) -> None:
    create_session(client, nodes[0], SESSION)
    _kill_mover_before(client, MoveStep.OPEN)
    with pytest.raises(MoveFailed, match="b owns it already: finish the move"):
        abort_move(client, SESSION)
