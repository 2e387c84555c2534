"""Where a replicated write's time goes: each stage of one group commit, timed apart.

    python -m scripts.bench_replication_stages [--requests N] [--rounds R]

On loopback: a real etcd, two follower nodes (``loopd serve`` with TLS ports) and, in
this process, the owner of a session of 3 copies (a cluster node; the shipper over the
worker's own TLS links, ``worker/follower_tls.py``). For N writes of the default App's
group (a User and an Assistant record) in each of R rounds it times:

- the owner's write and its fdatasync (``Session.append_many``, split at its
  ``on_written`` hook);
- a ``replica_position`` round trip to one follower (TLS, the gateway and its thread
  hop, no disk), and each ``replicate`` round trip as a follower's lane saw it;
- in this process, a follower's ``Replica.apply`` of the group: its checks
  (``replica_chunk``), its write and fdatasync;
- the whole write as the worker makes it, in alternating rounds: shipped after the
  owner's fdatasync (read back from the log, as before) and shipped while it runs
  (the bytes handed over at the write).

Medians in µs; the figures of one machine, for the breakdown in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import collections
import functools
import ssl
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.lease import LeaseTiming
from supervisor.cluster.node import ClusterNode
from supervisor.cluster.replica_set import place_replicas
from supervisor.cluster.transport import Role
from tests.etcd_server import EtcdServer, free_port
from tests.support import Daemon
from tests.tls_certs import Certificates
from worker import Assistant, Session, User
from worker.app import DefaultApp
from worker.follower_tls import TlsFollower, node_context
from worker.replication import Shipper
from worker.store import replica, replica_chunk
from worker.store.replica import Replica
from worker.store.replica_source import steps_after, tail_step
from worker.store.replica_types import Position, Step

SESSION = "stages"
T = "2026-12-01T18:00:00.000000Z"


def _group(key: str) -> list[User | Assistant]:
    return [User(time=T, text=key, key=key), Assistant(time=T, text=f"echo: {key}")]


def _median_us(values: list[float]) -> float:
    return statistics.median(values) * 1e6


def stages(root: Path, requests: int, rounds: int) -> dict[str, float]:
    certs = Certificates(root / "certs")
    etcd = EtcdServer(root / "etcd")
    etcd.start()
    daemons: list[Daemon] = []
    try:
        addresses = {name: f"tls://127.0.0.1:{free_port()}" for name in ("b", "c")}
        for name, address in addresses.items():
            files = certs.issue(name, Role.NODE)
            args = ["--cluster", etcd.url, "--node", name, "--lease-ttl", "10"]
            daemons.append(Daemon(root / name, *args, "--listen", address, *certs.args(files)))
        owner_files = certs.issue("a", Role.NODE)
        context = node_context(owner_files.ca, owner_files.cert, owner_files.key)
        with EtcdClient(etcd.url) as client:
            node = ClusterNode(client, "a", str(root / "a"), timing=LeaseTiming(ttl=10))
            node.start()
            app = DefaultApp(budget=1000)
            token = node.create(SESSION, app.initial_baseline(SESSION), slot=7)
            place_replicas(client, SESSION, token, 3, sorted(addresses))
            links = [TimedFollower(name, addresses[name], context) for name in sorted(addresses)]
            probe = TlsFollower("b", addresses["b"], context)
            try:
                with Session.open(root / "a", SESSION) as session:
                    shipper = Shipper(session, token, 3, links, sorted(addresses), _no_change)
                    shipper.start()
                    figures = _measure(session, shipper, probe, root, requests, rounds)
                    shipper.close()
            finally:
                for link in [*links, probe]:
                    link.close()
                node.close()
    finally:
        for daemon in daemons:
            daemon.stop()
        etcd.stop()
    return figures


class TimedFollower(TlsFollower):
    """The worker's link, each ``replicate`` timed from its send to its answer read
    (while ``timing``: the writes shipped after the owner's fdatasync, whose answers are
    read at once, not after a sync)."""

    def __init__(self, node: str, address: str, context: ssl.SSLContext) -> None:
        super().__init__(node, address, context)
        self.timing = False
        self.times: list[float] = []
        self._sent: collections.deque[float] = collections.deque()

    def send(self, step: Step) -> None:
        super().send(step)
        self._sent.append(time.perf_counter())

    def acknowledged(self, deadline: float) -> Position:
        position = super().acknowledged(deadline)
        sent = self._sent.popleft()
        if self.timing:
            self.times.append(time.perf_counter() - sent)
        return position


def _no_change(node: str, in_sync: bool) -> None:
    raise RuntimeError(f"follower {node} fell out of sync during the measurement")


def _measure(
    session: Session, shipper: Shipper, probe: TlsFollower, root: Path, requests: int,
    rounds: int,
) -> dict[str, float]:  # fmt: skip
    links = [f for f in shipper.followers.values() if isinstance(f, TimedFollower)]
    times: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        times.setdefault(name, []).append(value)

    written: list[float] = []
    count = 0
    for round_number in range(rounds):
        for overlapped in (False, True):
            for _ in range(requests):
                count += 1
                session.on_written = _stamp(written, shipper.written if overlapped else None)
                for follower in links:
                    follower.timing = not overlapped
                started = time.perf_counter()
                session.append_many(_group(f"k{count}"))
                synced = time.perf_counter()
                if shipper.ship() is not None:
                    raise RuntimeError("a follower did not acknowledge")
                done = time.perf_counter()
                add("overlapped" if overlapped else "after_fsync", done - started)
                add("owner_write", written[-1] - started)
                add("owner_fsync", synced - written[-1])
                if round_number == 0 and not overlapped:
                    add("position_rtt", _timed(lambda: probe.position(SESSION)))
    session.on_written = None
    for link in links:
        for value in link.times:
            add("replicate_rtt", value)
    _apply_stages(session, root, add, requests)
    return {name: _median_us(values) for name, values in times.items()}


def _stamp(
    marks: list[float], then: Callable[[int, int, int, bytes], None] | None
) -> Callable[[int, int, int, bytes], None]:
    def hook(epoch: int, offset: int, prior_crc: int, data: bytes) -> None:
        marks.append(time.perf_counter())
        if then is not None:
            then(epoch, offset, prior_crc, data)

    return hook


def _timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def _apply_stages(
    session: Session, root: Path, add: Callable[[str, float], None], requests: int
) -> None:
    """A follower's apply, in this process: a copy made from the owner's log, then the
    owner's next groups applied to it, its checks timed apart from the whole."""
    home = str(root / "a")
    first, *rest = steps_after(home, SESSION, None, 1 << 40)
    copy_root = root / "copy"
    with Replica.create(copy_root, first) as copy:  # a copy made from the owner's log
        for step in rest:
            copy.apply(step)
        check = replica_chunk.check_chunk
        checked: list[float] = []

        def timed_check(*args: object) -> replica_chunk.Chunk:
            started = time.perf_counter()
            chunk = check(*args)  # type: ignore[arg-type]
            checked.append(time.perf_counter() - started)
            return chunk

        for n in range(requests):
            at = copy.position
            session.append_many(_group(f"apply-{n}"))
            newest = Position(session.epoch, Path(session.log_path).stat().st_size, 0)
            (step,) = tail_step(home, SESSION, at, newest, 1 << 40)
            vars(replica)["check_chunk"] = timed_check  # its checks timed apart
            try:
                add("follower_apply", _timed(functools.partial(copy.apply, step)))
            finally:
                vars(replica)["check_chunk"] = check
            add("follower_checks", checked[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loopd-replication-stages-") as root:
        figures = stages(Path(root), args.requests, args.rounds)
    for name, value in figures.items():
        print(f"{name:>20}: {value:8.0f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
