"""Issue 30's first goal, measured: 100 SIGKILLs of every process of an owner's node under
keyed load, sessions in PostgreSQL (real etcd, PostgreSQL and three ``loopd serve``).

A seeded schedule picks, each round, a node that owns at least one session, SIGKILLs its
serve and every worker of it, and starts it again (same name, same home) once its lease
has expired, so the cluster keeps three nodes. For each session the killed node owned it
measures the time from the kill to the first reply carrying a higher token (the new
owner's). At the end every acknowledged key is in the database exactly once for its
session, read through the store's loader. The 100 kills run with ``pytest -m
cluster_sweep -s``; three kills run in the default suite.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

import pytest

from supervisor.client.cluster import ClusterClient
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import node_key
from supervisor.cluster.ownership import owner_of
from supervisor.cluster.routing import live_nodes
from tests.harness.etcd_server import EtcdServer
from tests.harness.postgres_server import PostgresServer
from tests.harness.support import Daemon, kill_node, poll_until
from worker.store.format.record_types import Record, User
from worker.store.postgres.store import PostgresStore
from worker.store.postgres.transfer import read_session

SEED: Final = 30
KILLS: Final = 100
NODES: Final = ("a", "b", "c")
SESSIONS: Final = tuple(f"s{i}" for i in range(6))
TTL: Final = 2  # the lease TTL of every node here, as in test_cluster_postgres.py
GOAL: Final = TTL + 1.0
"""Seconds from a kill within which each of its sessions is served again (the p99 goal)."""
SERVED_DEADLINE: Final = TTL + 30.0
"""Seconds after which a session not served again fails the run (a liveness bug)."""


@pytest.fixture(scope="module")
def server(postgres_server: PostgresServer) -> PostgresServer:
    return postgres_server


class Cluster:
    """Three serve nodes on one etcd and one database; a killed node is started again."""

    def __init__(self, etcd: EtcdServer, uri: str, root: Path) -> None:
        self.etcd = etcd
        self.uri = uri
        self.root = root
        self.nodes: dict[str, Daemon] = {}

    def start(self, name: str) -> None:
        self.nodes[name] = Daemon(
            self.root / name, "--cluster", self.etcd.url, "--node", name,
            "--lease-ttl", str(TTL), "--store", self.uri,
        )  # fmt: skip

    def stop(self) -> None:
        for daemon in self.nodes.values():
            daemon.stop()


@pytest.fixture
def cluster(etcd: EtcdServer, server: PostgresServer, tmp_path: Path) -> Iterator[Cluster]:
    nodes = Cluster(etcd, server.new_database(), tmp_path)
    try:
        for name in NODES:
            nodes.start(name)
        yield nodes
    finally:
        nodes.stop()


class KeyedLoad:
    """One client sending keyed requests to one session without pause, in a thread.

    A send that raises is sent again with the same key (its outcome was unknown), as a
    caller would; the error is recorded."""

    def __init__(self, url: str, session: str) -> None:
        self.cluster = ClusterClient(url, timeout=10, retry_for=30)
        self.session = session
        self.acknowledged: list[str] = []
        self.errors: list[str] = []
        self.served_by: list[tuple[float, int]] = []  # (when, token) of each reply
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"load-{session}")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self.cluster.close()
        assert not self._thread.is_alive(), f"the client of {self.session} did not stop"

    def first_reply_above(self, token: int) -> float | None:
        """When the first reply with a token above ``token`` came, or None."""
        return next((when for when, t in list(self.served_by) if t > token), None)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            key = f"{self.session}-k{n}"
            try:
                reply = self.cluster.send(self.session, f"text {n}", key=key)
            except Exception as exc:  # noqa: BLE001 - recorded and reported; sent again by key
                self.errors.append(f"{key}: {type(exc).__name__}: {exc}")
                self._stop.wait(0.2)
                continue
            token = reply["token"]
            assert isinstance(token, int)
            self.served_by.append((time.monotonic(), token))
            self.acknowledged.append(key)
            n += 1


def _stored_keys(uri: str, session: str) -> list[str]:
    """The key of every User record of every epoch, through the store's loader."""
    keys: list[str] = []

    def collect(records: Sequence[Record]) -> None:
        keys.extend(str(r.key) for r in records if isinstance(r, User))

    read_session(PostgresStore(uri), session, on_epoch=collect, history=True)
    return keys


def _percentile(values: list[float], pct: float) -> float:
    """The nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


@pytest.mark.cluster_sweep
@pytest.mark.timeout(2400)
def test_a_hundred_node_kills_under_keyed_load_lose_no_key_and_apply_none_twice(
    cluster: Cluster,
) -> None:
    _kill_run(cluster, KILLS, GOAL)


@pytest.mark.timeout(300)
def test_three_node_kills_lose_no_key_and_each_session_is_served_within_ttl_plus_a_second(
    cluster: Cluster,
) -> None:
    """The default suite's slice, with a bound past the 100-kill run's tail (3.2 s) that
    still catches a client retrying a dead node's socket for 2 s past the owner key's
    expiry (served again 4.1 s after a kill, TTL 2 s)."""
    _kill_run(cluster, 3, TTL + 1.5)


def _kill_run(cluster: Cluster, kills: int, bound: float) -> None:
    """``kills`` seeded kills under keyed load; assert 0 lost, 0 twice, p99 <= ``bound``."""
    rng = random.Random(SEED)
    url = cluster.etcd.url
    with ClusterClient(url, timeout=20, retry_for=30) as setup:
        for session in SESSIONS:
            setup.create(session)
    loads = {s: KeyedLoad(url, s) for s in SESSIONS}
    served_again: list[float] = []
    schedule: list[str] = []
    started = time.monotonic()
    with EtcdClient(url) as etcd:
        try:
            for load in loads.values():
                load.start()
            poll_until(lambda: all(ld.acknowledged for ld in loads.values()), what="every load")
            for kill in range(kills):
                owners = {s: owner_of(etcd, s) for s in SESSIONS}
                held = sorted({o.node for o in owners.values() if o is not None})
                victim = rng.choice(held)
                tokens = {s: o.token for s, o in owners.items() if o and o.node == victim}
                schedule.append(f"{victim}:{','.join(sorted(tokens))}")
                killed_at = time.monotonic()
                kill_node(cluster.nodes[victim])

                def done(tokens: dict[str, int] = tokens, victim: str = victim) -> bool:
                    served = all(loads[s].first_reply_above(t) for s, t in tokens.items())
                    return served and etcd.get(node_key(victim)) is None

                what = f"kill {kill} (seed {SEED}, {victim}: {sorted(tokens)}) served again"
                poll_until(done, timeout=SERVED_DEADLINE, what=f"{what} and its lease gone")
                times = []
                for session, token in tokens.items():
                    when = loads[session].first_reply_above(token)
                    assert when is not None
                    times.append(f"{session} {when - killed_at:.2f} s")
                    served_again.append(when - killed_at)
                # CLOCK_MONOTONIC, as the nodes' takeover lines: a breakdown per kill
                print(f"kill {kill} of {victim} at {killed_at:.3f}: {', '.join(times)}")
                cluster.start(victim)

                def registered(victim: str = victim) -> bool:
                    return victim in live_nodes(etcd)

                poll_until(registered, what=f"{victim} registered again")
            poll_until(
                lambda: all(len(ld.acknowledged) >= 2 for ld in loads.values()), what="last load"
            )
        finally:
            for load in loads.values():
                load.stop()
    elapsed = time.monotonic() - started

    acknowledged = sum(len(ld.acknowledged) for ld in loads.values())
    lost: list[str] = []
    twice: list[str] = []
    for session, load in loads.items():
        counts = Counter(_stored_keys(cluster.uri, session))
        lost += [k for k in load.acknowledged if counts[k] == 0]
        twice += [k for k, n in counts.items() if n > 1]
    errors = [e for ld in loads.values() for e in ld.errors]
    p50, p99 = _percentile(served_again, 50), _percentile(served_again, 99)
    print(
        f"\nseed {SEED}: {kills} kills in {elapsed:.0f} s, {len(served_again)} sessions "
        f"failed over; {acknowledged} keys acknowledged, {len(lost)} lost, {len(twice)} "
        f"applied twice; served again p50 {p50:.2f} s, p99 {p99:.2f} s, max "
        f"{max(served_again):.2f} s (lease TTL {TTL} s, goal p99 <= {GOAL:.0f} s); "
        f"client errors (sent again by key): {len(errors)}"
    )
    print(f"kills: {' '.join(schedule)}")
    for error in errors[:20]:
        print(f"client error: {error}")
    assert not lost, f"seed {SEED}: acknowledged keys lost: {lost[:20]}"
    assert not twice, f"seed {SEED}: keys applied twice: {twice[:20]}"
    assert p99 <= bound, f"seed {SEED}: p99 time to serve again {p99:.2f} s > {bound} s"
