"""The faults of ``loopd chaos cluster``, each applied to the hosts and healed.

Partitions are made inside the namespaces with iproute2: a ``blackhole`` route to the
other side's address in each of the two namespaces (``partition-node-etcd``,
``partition-node-node``, ``partition-client-node``), or the host's own link set down
(``isolate-node``: cut from everyone). ``netem`` puts ``tc netem`` delay, jitter and loss
on a node's link. ``kill-host`` SIGKILLs every process of a node's host, then starts its
``loopd serve`` again on the same disk, as an operator would. ``pause-node`` SIGSTOPs every
process of a node's host for longer than its lease, then SIGCONTs them.
``kill-etcd-member`` (three members only) SIGKILLs one member's host and starts it again
on its data. ``move`` moves a session to another node (``loopd move`` from the client
host). With ``--store postgres``, ``kill-db-primary`` and ``kill-db-standby`` SIGKILL a
database server's host: the primary's, or one of its two standbys' in turn
(``chaos/cluster/database.py`` heals them: a failover to the most advanced standby, a
restart). Every fault is picked from the run's seeded random generator.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from chaos.cluster.netns_hosts import IP, HarnessError, Host
from chaos.cluster.promotion import fail_over
from chaos.proc_states import all_stopped

if TYPE_CHECKING:
    from chaos.cluster.database import ReplicatedDatabase

TC: Final = "tc"
KINDS: Final = (
    "partition-node-etcd",
    "partition-node-node",
    "partition-client-node",
    "isolate-node",
    "netem",
    "kill-host",
    "pause-node",
    "kill-etcd-member",
    "move",
    "kill-db-primary",
    "kill-db-standby",
)
DATABASE_KINDS: Final = ("kill-db-primary", "kill-db-standby")


def run(argv: list[str]) -> None:
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise HarnessError(f"{' '.join(argv)}: {done.stderr.strip()}")


def blackhole(host: Host, other: Host, *, add: bool) -> None:
    """Drop (or stop dropping) what ``host`` sends to ``other``'s address."""
    run([IP, "-n", host.netns, "route", "add" if add else "del", "blackhole",
         f"{other.address}/32"])  # fmt: skip


def pids_of(host: Host) -> list[int]:
    found = subprocess.run([IP, "netns", "pids", host.netns], check=False,
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    return [int(pid) for pid in found.stdout.split()]


def signal_host(host: Host, signum: int) -> int:
    """Send ``signum`` to every process of ``host``; how many got it."""
    sent = 0
    for pid in pids_of(host):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            continue
        sent += 1
    return sent


STOP_WAIT: Final = 5.0
"""Seconds a paused host's processes are given to be stopped, every thread of each."""


def wait_stopped(pids: list[int], timeout: float) -> float | None:
    """Seconds until every thread of ``pids`` was seen stopped (``all_stopped``); None if
    some were not within ``timeout``."""
    began = time.monotonic()
    while not all(all_stopped(pid) for pid in pids):
        if time.monotonic() - began > timeout:
            return None
        time.sleep(0.002)  # the interval of the checks, against the deadline above
    return round(time.monotonic() - began, 4)


@dataclass
class Fault:
    """One fault: what it is, on what, when it was applied and healed."""

    kind: str
    targets: list[str]
    hold: float
    detail: dict[str, Any] = field(default_factory=dict)
    applied: float = 0.0
    healed: float = 0.0
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "targets": self.targets, "hold": round(self.hold, 3),
                "detail": self.detail, "applied": self.applied, "healed": self.healed,
                "error": self.error}  # fmt: skip


@dataclass
class Rig:
    """The hosts the faults act on, and how to start a node or an etcd member again."""

    nodes: dict[str, Host]
    etcd: list[Host]
    client: Host
    restart_node: Callable[[str], None]
    restart_etcd: Callable[[int], None]
    move: Callable[[str, str], dict[str, Any]]
    sessions: list[str]
    lease_ttl: float
    only: tuple[str, ...] = ()
    """The kinds to draw from (empty: every kind this cluster can take)."""
    netem: bool = True
    """The kernel has ``sch_netem``; without it a ``tbf`` rate limit stands in."""
    database: ReplicatedDatabase | None = None
    """The sessions' PostgreSQL primary and standbys (``--store postgres``), else None."""


def qdisc(detail: dict[str, Any]) -> list[str]:
    """The qdisc of a ``netem`` fault: netem's delay, jitter and loss, or, on a kernel
    without netem, a token bucket of ``rate_kbit`` whose queue holds ``delay_ms`` of
    traffic: what waits is delayed, what overflows is lost."""
    d = detail
    if d["qdisc"] == "netem":
        return ["netem", "delay", f"{d['delay_ms']}ms", f"{d['jitter_ms']}ms",
                "loss", f"{d['loss_pct']}%"]  # fmt: skip
    return ["tbf", "rate", f"{d['rate_kbit']}kbit", "burst", "16kbit",
            "latency", f"{d['delay_ms']}ms"]  # fmt: skip


def netem_problem(host: Host) -> str | None:
    """Why ``tc netem`` cannot run on ``host``'s link (the kernel's sch_netem), or None."""
    base = [IP, "netns", "exec", host.netns, TC, "qdisc"]
    probe = [*base, "add", "dev", host.interface, "root", "netem", "delay", "1ms"]
    done = subprocess.run(probe, check=False, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return done.stderr.strip() or f"tc exited {done.returncode}"
    run([*base, "del", "dev", host.interface, "root"])
    return None


def kinds_for(rig: Rig) -> list[str]:
    """The fault kinds this cluster can take (two nodes for node-from-node and moves,
    three etcd members to lose one)."""
    kinds = list(KINDS)
    if len(rig.nodes) < 2:
        kinds = [k for k in kinds if k not in ("partition-node-node", "move")]
    if len(rig.etcd) < 3:
        kinds.remove("kill-etcd-member")
    if rig.database is None:
        kinds = [k for k in kinds if k not in DATABASE_KINDS]
    if rig.only:
        kinds = [k for k in kinds if k in rig.only]
    return kinds


def pick(rng: random.Random, rig: Rig) -> Fault:
    """The next fault, from the seeded generator only (the same seed, the same faults)."""
    kinds = kinds_for(rig)
    if not kinds:
        raise HarnessError(f"none of the fault kinds {list(rig.only)} can run on this cluster")
    kind = rng.choice(kinds)
    names = sorted(rig.nodes)
    node = rng.choice(names)
    hold = rng.uniform(1.0, 4.0)
    if kind == "partition-node-node":
        return Fault(kind, rng.sample(names, 2), hold)
    if kind == "netem":
        detail: dict[str, Any] = {
            "delay_ms": rng.choice([50, 200, 500]), "jitter_ms": rng.choice([0, 50]),
            "loss_pct": rng.choice([0, 10, 30]), "rate_kbit": rng.choice([64, 256, 1024]),
        }  # fmt: skip
        detail["qdisc"] = "netem" if rig.netem else "tbf"
        return Fault(kind, [node], hold, detail)
    if kind == "pause-node":
        return Fault(kind, [node], rig.lease_ttl + rng.uniform(1.0, 2.5))
    if kind == "kill-etcd-member":
        return Fault(kind, [f"etcd{rng.randrange(len(rig.etcd))}"], hold)
    if kind == "move":
        return Fault(kind, [rng.choice(rig.sessions), node], 0.0)
    if kind in DATABASE_KINDS:
        assert rig.database is not None
        db = rig.database
        return Fault(kind, [db.name(db.primary if kind == "kill-db-primary"
                                    else db.standby_to_kill())], hold)  # fmt: skip
    return Fault(kind, [node], hold)


def _pairs(fault: Fault, rig: Rig) -> list[tuple[Host, Host]]:
    node = rig.nodes[fault.targets[0]]
    if fault.kind == "partition-node-etcd":
        return [(node, e) for e in rig.etcd] + [(e, node) for e in rig.etcd]
    if fault.kind == "partition-client-node":
        return [(node, rig.client), (rig.client, node)]
    other = rig.nodes[fault.targets[1]]
    return [(node, other), (other, node)]


def apply(fault: Fault, rig: Rig) -> None:
    """Make the fault happen (a ``move`` happens whole here; its result in ``detail``)."""
    fault.applied = time.monotonic()
    kind = fault.kind
    if kind.startswith("partition-"):
        for host, other in _pairs(fault, rig):
            blackhole(host, other, add=True)
    elif kind == "isolate-node":
        host = rig.nodes[fault.targets[0]]
        run([IP, "-n", host.netns, "link", "set", host.interface, "down"])
    elif kind == "netem":
        host = rig.nodes[fault.targets[0]]
        run([IP, "netns", "exec", host.netns, TC, "qdisc", "add", "dev", host.interface,
             "root", *qdisc(fault.detail)])  # fmt: skip
    elif kind == "kill-host":
        fault.detail["killed"] = signal_host(rig.nodes[fault.targets[0]], signal.SIGKILL)
        rig.nodes[fault.targets[0]].kill_all()
        fault.detail["killed_at"] = time.monotonic()  # every process of it reaped
    elif kind == "pause-node":
        host = rig.nodes[fault.targets[0]]
        fault.detail["stopped"] = signal_host(host, signal.SIGSTOP)
        # A SIGSTOP is in effect only once one thread of each process has taken it: the
        # hold starts when every thread of the host is seen stopped (docs/chaos.md).
        fault.detail["stopped_after_s"] = wait_stopped(pids_of(host), STOP_WAIT)
    elif kind == "kill-etcd-member":
        member = rig.etcd[int(fault.targets[0].removeprefix("etcd"))]
        fault.detail["killed"] = signal_host(member, signal.SIGKILL)
        member.kill_all()
    elif kind == "move":
        fault.detail.update(rig.move(fault.targets[0], fault.targets[1]))
    elif kind in DATABASE_KINDS:
        host = _database_host(fault, rig)
        fault.detail["killed"] = signal_host(host, signal.SIGKILL)
        host.kill_all()
        fault.detail["killed_at"] = time.monotonic()  # every process of it reaped


def _database_host(fault: Fault, rig: Rig) -> Host:
    assert rig.database is not None
    return next(h for h in rig.database.hosts if h.name == fault.targets[0])


def heal(fault: Fault, rig: Rig) -> None:
    """Undo the fault: routes removed, link up, qdisc removed, processes started or
    continued again. ``heal_began``: from then on a reply held back may get through."""
    fault.detail["heal_began"] = time.monotonic()
    kind = fault.kind
    if kind.startswith("partition-"):
        for host, other in _pairs(fault, rig):
            blackhole(host, other, add=False)
    elif kind == "isolate-node":
        host = rig.nodes[fault.targets[0]]
        run([IP, "-n", host.netns, "link", "set", host.interface, "up"])
    elif kind == "netem":
        host = rig.nodes[fault.targets[0]]
        run([IP, "netns", "exec", host.netns, TC, "qdisc", "del", "dev", host.interface, "root"])
    elif kind == "kill-host":
        rig.restart_node(fault.targets[0])
    elif kind == "pause-node":
        signal_host(rig.nodes[fault.targets[0]], signal.SIGCONT)
    elif kind == "kill-etcd-member":
        rig.restart_etcd(int(fault.targets[0].removeprefix("etcd")))
    elif kind == "kill-db-primary":
        assert rig.database is not None
        fault.detail.update(fail_over(rig.database))
    elif kind == "kill-db-standby":
        assert rig.database is not None
        fault.detail.update(rig.database.restart_standby(fault.targets[0]))
    fault.healed = time.monotonic()
