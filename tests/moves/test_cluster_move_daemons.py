"""``loopd move`` between real daemons under keyed load, with the source or the target
daemon SIGKILLed before a step of the move: never two writers, and the rerun finishes."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.cases import CaseResult
from chaos.oracle.oracle import ClientLog, check_final, snapshot_logs
from chaos.scenarios.scenarios import SESSION, SLOT, Scenario
from supervisor.cli.cluster_commands import DaemonControl
from supervisor.client.cluster import ClusterClient
from supervisor.cluster.errors import ClusterError
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import move_key
from supervisor.errors import ControlError
from supervisor.moves.move import MoveStep, move_session
from tests.harness.cluster_support import writers
from tests.harness.etcd_server import EtcdServer
from tests.harness.support import Daemon, poll_until
from worker.store.disk.layout import session_dir

TTL = "2"
DEFAULT_SLICE = {("source", MoveStep.SEAL), ("target", MoveStep.OWN)}
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


def _serve(url: str, name: str, home: Path) -> Daemon:
    return Daemon(home, "--cluster", url, "--node", name, "--lease-ttl", TTL)


@pytest.fixture
def client(etcd: EtcdServer) -> Iterator[EtcdClient]:
    with EtcdClient(etcd.url) as client:
        yield client


def _send(cluster: ClusterClient, log: ClientLog, keys: list[str]) -> None:
    for key in keys:
        log.start(key)
        with contextlib.suppress(ControlError, ClusterError):
            cluster.send(SESSION, f"text of {key}", key=key)
            log.ack(key, 0)


def _moved(client: EtcdClient) -> bool:
    try:
        move_session(client, SESSION, "b", control=DaemonControl())
    except (ClusterError, ControlError):
        return False
    return True


@pytest.mark.parametrize(("role", "step"), CASES)
def test_a_daemon_killed_before_a_move_step_leaves_one_writer_and_the_move_completes(
    etcd: EtcdServer, client: EtcdClient, tmp_path: Path, role: str, step: MoveStep
) -> None:
    homes = {"a": tmp_path / "a", "b": tmp_path / "b"}
    daemons = {"a": _serve(etcd.url, "a", homes["a"])}
    try:
        with ClusterClient(etcd.url, timeout=10) as cluster:
            cluster.create(SESSION, slot=SLOT)  # on a, the only node yet
            daemons["b"] = _serve(etcd.url, "b", homes["b"])
            log = ClientLog()
            _send(cluster, log, [f"before{n}" for n in range(5)])
            assert len(log.acked) == 5
            victim = "a" if role == "source" else "b"

            def kill(now: MoveStep) -> None:
                if now is step:
                    os.kill(daemons[victim].proc.pid, signal.SIGKILL)
                    daemons[victim].stop()  # reap it and its workers

            with contextlib.suppress(ClusterError, ControlError):
                move_session(client, SESSION, "b", control=DaemonControl(), before_step=kill)
            assert len(writers(client, homes, SESSION)) <= 1
            _send(cluster, log, ["during0", "during1"])

            daemons[victim] = _serve(etcd.url, victim, homes[victim])
            poll_until(lambda: _moved(client), timeout=30, what="the rerun of the move")
            assert writers(client, homes, SESSION) == ["b"]
            assert client.get(move_key(SESSION)) is None
            assert not Path(session_dir(homes["a"], SESSION)).exists()
            keys = [*sorted(log.acked | log.in_flight), "after0", "after1"]
            _send(cluster, log, keys)
            assert set(keys) <= log.acked
        after = snapshot_logs(str(homes["b"]))
        result = CaseResult(case=f"daemon-move-{role}:{step.value}", fault="kill", boundary="")
        scenario = Scenario(
            name="cluster-move", ops=(), doc="", requests=tuple((k, k) for k in keys)
        )
        check_final(result, scenario, log, after, str(homes["b"]))
        assert result.violations == []
    finally:
        for daemon in daemons.values():
            daemon.stop()
