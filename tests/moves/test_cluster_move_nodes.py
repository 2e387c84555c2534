"""A move under keyed load through real node processes, with the source or target SIGKILLed
before each step: one writer at most, the move completes once the node is back."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.cases import CaseResult
from chaos.oracle.oracle import ClientLog, check_after_fault, check_final, snapshot_logs
from chaos.scenarios.scenarios import SESSION, Scenario
from supervisor.cluster.errors import MoveFailed
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import move_key, node_value, placement_key
from supervisor.cluster.ownership import owner_of
from supervisor.cluster.routing import TokenGuard
from supervisor.moves.move import MoveStep, move_session
from tests.harness.cluster_support import APP, TTL, NodeProcess, writers
from tests.harness.etcd_server import EtcdServer
from tests.harness.support import poll_until
from worker import Session
from worker.store.disk.layout import session_dir

DEFAULT_SLICE = {("source", MoveStep.SEAL), ("target", MoveStep.OWN), ("target", MoveStep.OPEN)}
"""The cases run by default; ``-m cluster_sweep`` runs every role at every step."""
CASES = [
    pytest.param(
        role,
        step,
        id=f"{role}-{step.value}",
        marks=() if (role, step) in DEFAULT_SLICE else pytest.mark.cluster_sweep,
    )
    for role in ("source", "target")
    for step in MoveStep
]


@pytest.fixture
def client(etcd: EtcdServer) -> Iterator[EtcdClient]:
    with EtcdClient(etcd.url) as client:
        yield client


class Load:
    """The client: keyed writes routed through etcd to the owner's process, tokens guarded."""

    def __init__(self, client: EtcdClient, processes: dict[str, NodeProcess]) -> None:
        self.client = client
        self.processes = processes
        self.log = ClientLog()
        self.guard = TokenGuard()

    def send(self, keys: list[str]) -> None:
        for key in keys:
            self.log.start(key)
            owner = owner_of(self.client, SESSION)
            process = self.processes.get(owner.node) if owner is not None else None
            if process is None:
                continue
            reply = process.send(key)
            if reply["ok"] is True:
                token = reply["token"]
                assert isinstance(token, int)
                self.guard.check(SESSION, token)
                self.log.ack(key, 0)


def _moved(client: EtcdClient) -> bool:
    try:
        move_session(client, SESSION, "b")
    except MoveFailed:
        return False
    return True


MOVE_SCENARIO = Scenario(name="cluster-move", ops=(), doc="default-app requests, moved")
"""The oracle's view of these tests: keyed requests of the default app, no store ops."""


@pytest.mark.parametrize(("role", "step"), CASES)
def test_a_node_killed_before_a_move_step_leaves_one_writer_and_the_move_completes(
    etcd: EtcdServer, client: EtcdClient, tmp_path: Path, role: str, step: MoveStep
) -> None:
    homes = {"a": tmp_path / "a", "b": tmp_path / "b"}
    Session.create(homes["a"], SESSION, APP.initial_baseline(SESSION), slot=7).close()
    client.put(placement_key(SESSION), node_value("a"))
    processes = {name: NodeProcess(etcd.url, name, home) for name, home in homes.items()}
    load = Load(client, processes)
    victim = "a" if role == "source" else "b"
    try:
        load.send([f"before{n}" for n in range(6)])
        assert load.log.acked == {f"before{n}" for n in range(6)}

        def kill_victim(now: MoveStep) -> None:
            if now is step:
                processes.pop(victim).kill()

        with contextlib.suppress(MoveFailed):  # a rerun finishes it
            move_session(client, SESSION, "b", before_step=kill_victim)
        able = writers(client, homes, SESSION)
        assert len(able) <= 1
        load.send(["during0", "during1"])
        holder = (
            homes["b"]
            if able == ["b"] or not Path(session_dir(homes["a"], SESSION)).exists()
            else homes["a"]
        )
        after_fault = snapshot_logs(str(holder))
        result = CaseResult(case=f"move-{role}:{step.value}", fault="kill", boundary=step.value)
        check_after_fault(result, MOVE_SCENARIO, load.log, after_fault)

        processes[victim] = NodeProcess(etcd.url, victim, homes[victim])
        poll_until(lambda: _moved(client), timeout=TTL * 10, what="the rerun of the move")
        processes["b"].claim()
        assert writers(client, homes, SESSION) == ["b"]
        assert client.get(move_key(SESSION)) is None
        assert not Path(session_dir(homes["a"], SESSION)).exists()
        keys = [*sorted(load.log.acked | load.log.in_flight), "after0", "after1"]
        load.send(keys)
        assert {"after0", "after1"} <= load.log.acked
        scenario = Scenario(
            name="cluster-move", ops=(), doc="", requests=tuple((k, k) for k in keys)
        )
        check_final(result, scenario, load.log, after_fault, str(homes["b"]))
        assert result.violations == []
    finally:
        for process in processes.values():
            process.stop()
