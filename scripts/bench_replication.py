"""Benchmark a replicated request's round trip against an unreplicated one.

    python -m scripts.bench_replication [--requests N] [--rounds R] [--netns] [--write-docs]

On loopback: a real etcd and three ``loopd serve`` nodes with TLS ports, their homes on
the same disk. Two sessions, one created with ``--replicas 1`` and one with
``--replicas 3`` (its owner ships each group commit to the two other nodes and waits
for their fdatasync before it answers). In alternating rounds it times N keyed
requests to each, one at a time, from one ``ClusterClient`` over mutual TLS. The figure
is the ratio of the medians (replicated / unreplicated), the issue's goal being 2x or
less. ``--netns`` (root) measures it between namespaced hosts too, the issue's setting
(``tests/netns_hosts.py``, as ``scripts/bench_cluster_tls.py``): etcd, three nodes each
with a disk of its own (a directory of the machine's disk, bind-mounted) and a client
host, on one bridge; the client host's ``scripts/bench_replication_probe.py`` times a
request of each session in turn. ``--write-docs`` replaces the replication section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import tempfile
import time
from pathlib import Path

from supervisor.client.cluster import ClusterClient
from supervisor.cluster.transport import Role
from tests.etcd_server import EtcdServer, free_port
from tests.netns_cluster import host_certificates, private_files, run_client, start_etcd
from tests.netns_cluster import start_node as start_host_node
from tests.netns_hosts import Hosts, namespaces_problem
from tests.support import Daemon
from tests.tls_certs import Certificates

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
START, END = "<!-- replication-bench:start -->", "<!-- replication-bench:end -->"
SESSIONS = {"one": 1, "three": 3}


def timed(client: ClusterClient, session: str, count: int, tag: str) -> list[float]:
    times = []
    for n in range(count):
        started = time.perf_counter()
        client.send(session, "x", key=f"{tag}-{n}")
        times.append(time.perf_counter() - started)
    return times


def bench(root: Path, requests: int, rounds: int) -> dict[str, float]:
    certs = Certificates(root / "certs")
    etcd = EtcdServer(root / "etcd")
    etcd.start()
    daemons = []
    try:
        for name in ("a", "b", "c"):
            files = certs.issue(name, Role.NODE)
            args = ["--cluster", etcd.url, "--node", name, "--lease-ttl", "10"]
            args += ["--listen", f"tls://127.0.0.1:{free_port()}", *certs.args(files)]
            daemons.append(Daemon(root / name, *args))
        client_files = certs.issue("bench", Role.CLIENT)
        with ClusterClient(etcd.url, timeout=30, tls=client_files) as client:
            for session, replicas in SESSIONS.items():
                client.create(session, replicas=replicas)
                timed(client, session, 20, "warm")
            medians: dict[str, list[float]] = {session: [] for session in SESSIONS}
            for round_number in range(rounds):
                for session in SESSIONS:
                    times = timed(client, session, requests, f"r{round_number}")
                    medians[session].append(statistics.median(times))
    finally:
        for daemon in daemons:
            daemon.stop()
        etcd.stop()
    figures = {f"{s}_us": statistics.median(values) * 1e6 for s, values in medians.items()}
    figures["ratio"] = figures["three_us"] / figures["one_us"]
    return figures


def bench_netns(root: Path, requests: int, rounds: int, *, disk: bool) -> dict[str, float]:
    """The same ratio between namespaced hosts, each node's home on a disk of its own
    (``disk``) or in its host's tmpfs (the fdatasyncs then cost next to nothing)."""
    certs = Certificates(root / "ca")
    with Hosts(root / "hosts") as hosts:
        etcd_host = hosts.add("etcd")
        nodes = [hosts.add(name, disk=disk) for name in ("a", "b", "c")]
        client = hosts.add("client")
        url = start_etcd(etcd_host)
        for host in nodes:
            start_host_node(host, host.name, url, certs)
        run_client(client, certs, url, [host.name for host in nodes], [])  # all answer
        copy = host_certificates(certs, client, "bench", Role.CLIENT)
        files = private_files(client)
        env = [f"LOOPD_TLS_CA={files.ca}", f"LOOPD_TLS_CERT={files.cert}",
               f"LOOPD_TLS_KEY={files.key}"]  # fmt: skip
        argv = client.python("-m", "scripts.bench_replication_probe", str(requests),
                             str(rounds), url)  # fmt: skip
        done = client.run(["env", *env, *argv], copy=copy, timeout=1800)
        if done.returncode != 0:
            raise SystemExit(f"the client host's probe failed: {done.stderr[-2000:]}")
    found = json.loads(done.stdout)
    kind = "disk" if disk else "tmpfs"
    figures = {
        f"{kind}_{s}_us": statistics.median(statistics.median(r) for r in found[s]["rounds"]) * 1e6
        for s in SESSIONS
    }
    figures[f"{kind}_ratio"] = figures[f"{kind}_three_us"] / figures[f"{kind}_one_us"]
    return figures


def render(figures: dict[str, float], requests: int, rounds: int, netns: bool) -> str:
    flag = " --netns" if netns else ""
    text = f"""{START}
## Replicated sessions (the cost of shipping before the acknowledgement)

`python -m scripts.bench_replication --requests {requests} --rounds {rounds}{flag} --write-docs`
on {platform.machine()} Linux, Python {platform.python_version()}, {os.cpu_count()}
cores. Each group is shipped to the followers while the owner's own fdatasync runs, and
answered once both are done (docs/scaling.md, section 9.2).

On loopback: a real etcd and three nodes with TLS ports, their homes on one disk; one
`ClusterClient` over mutual TLS; the median of {rounds} alternating rounds' medians of
{requests} keyed requests, one at a time.

| round trip of one request, loopback | median |
|---|---|
| `--replicas 1` (the owner's fdatasync) | {figures["one_us"]:.0f} µs |
| `--replicas 3` (and both followers', over TLS) | {figures["three_us"]:.0f} µs |
| replicated / unreplicated | {figures["ratio"]:.2f}x |
"""
    if netns:
        text += f"""
Between namespaced hosts (root): etcd, three nodes and a client, each a network
namespace of its own on one bridge (veth pairs); the client host sends one request to
each session in turn; the median of {rounds} rounds' medians of {requests}. Each node's
home on a disk of its own (a directory of the machine's one disk, bind-mounted), or in
its host's tmpfs (as `scripts/bench_cluster_tls.py`: the fdatasyncs cost next to nothing, what
is left is the transport's and the processes' cost).

| round trip of one request, between hosts | homes on disks | homes in tmpfs |
|---|---|---|
| `--replicas 1` | {figures["disk_one_us"]:.0f} µs | {figures["tmpfs_one_us"]:.0f} µs |
| `--replicas 3` | {figures["disk_three_us"]:.0f} µs | {figures["tmpfs_three_us"]:.0f} µs |
| replicated / unreplicated | {figures["disk_ratio"]:.2f}x | {figures["tmpfs_ratio"]:.2f}x |
"""
    worst = max(figures["ratio"], figures.get("disk_ratio", 0.0), figures.get("tmpfs_ratio", 0.0))
    verdict = "Within the goal of 2x" if worst <= 2 else f"Above the goal of 2x ({worst:.2f}x)"
    text += f"""
{verdict}. The nodes share one machine
({os.cpu_count()} cores) and one physical disk, so the followers' fdatasyncs and TLS
handling contend with the owner's for both.
{END}"""
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--netns", action="store_true", help="also between namespaced hosts")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    if args.netns and (problem := namespaces_problem()) is not None:
        raise SystemExit(f"bench_replication --netns: {problem}")
    with tempfile.TemporaryDirectory(prefix="loopd-replication-bench-") as root:
        figures = bench(Path(root), args.requests, args.rounds)
        if args.netns:
            for disk in (True, False):
                where = Path(root) / ("disk" if disk else "tmpfs")
                figures |= bench_netns(where, args.requests, args.rounds, disk=disk)
    text = render(figures, args.requests, args.rounds, args.netns)
    print(text)
    if args.write_docs:
        docs = DOCS.read_text()
        pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.DOTALL)
        docs = (
            pattern.sub(text, docs)
            if pattern.search(docs)
            else docs.rstrip() + "\n\n" + text + "\n"
        )
        DOCS.write_text(docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
