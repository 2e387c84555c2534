"""Benchmark the TLS transport: a round trip between two hosts against the unix socket.

    python -m scripts.cluster.bench_cluster_tls [--requests N] [--rounds R] [--write-docs]

(also ``python -m scripts.cluster.bench_cluster --tls``). Needs root: it builds the hosts of
the cluster tests (``tests/harness/netns_hosts.py``): etcd, one node, one client, each a
network namespace of its own on one bridge. One session on the node; in alternating
rounds it times N keyed requests (after a warm-up) sent four ways: from the client host
over mutual TLS to the node's ``tls://`` port on the direct path (``ClusterClient.send``:
the TCP connection handed to the worker, which makes the handshake and answers), from
the client host over TLS started at once (relayed by the node's TLS thread and its
daemon to the worker), on the node's host through its unix socket with the same
relayed ``send``, and on the node's host through the worker's own handed-over unix
connection (``Client``); the two TLS ways take turns request by request in one client
process, the two unix ways too, so each pair meets the same load. The figures are
ratios of median round trips, and of the fastest tenth.
``--write-docs`` replaces the TLS section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path

from scripts.harness.benchmarks_doc import write_section
from tests.harness.netns_cluster import run_client, start_etcd, start_node
from tests.harness.netns_hosts import Host, Hosts, namespaces_problem
from tests.harness.tls_certs import Certificates

MODES = ("tls-direct", "tls-relay", "unix-relay", "unix-direct")
TAG = "cluster-tls-bench"
START, END = f"<!-- {TAG}:start -->", f"<!-- {TAG}:end -->"


def probe(host: Host, pair: str, count: int, url: str, node: object) -> dict[str, list[float]]:
    argv = host.python("-m", "scripts.cluster.bench_tls_probe", pair, str(count), "bench", url,
                       str(host.private / "home"))  # fmt: skip
    if pair == "tls":
        env = [f"LOOPD_TLS_{k}={host.private / 'certs' / f}" for k, f in
               (("CA", "ca.pem"), ("CERT", "cert.pem"), ("KEY", "key.pem"))]  # fmt: skip
        done = host.run(["env", *env, *argv], copy=host.root / "certs", timeout=300)
    else:
        done = host.inside(node, argv, timeout=300)  # type: ignore[arg-type]
    if done.returncode != 0:
        raise SystemExit(f"{pair} probe failed: {done.stderr[-2000:]}")
    times: dict[str, list[float]] = json.loads(done.stdout)
    return times


def bench(root: Path, requests: int, rounds: int) -> dict[str, float]:
    certs = Certificates(root / "ca")
    with Hosts(root / "hosts") as hosts:
        etcd_host, node_host, client = hosts.add("etcd"), hosts.add("a"), hosts.add("client")
        url = start_etcd(etcd_host)
        node = start_node(node_host, "a", url, certs)
        made = run_client(client, certs, url, ["a"], [{"create": "bench"}])
        if "ok" not in made[0]:
            raise SystemExit(f"create failed: {made}")
        medians: dict[str, list[float]] = {mode: [] for mode in MODES}
        samples: dict[str, list[float]] = {mode: [] for mode in MODES}
        load = os.getloadavg()[0]
        for _ in range(rounds):
            for pair, host in (("tls", client), ("unix", node_host)):
                for mode, times in probe(host, pair, requests, url, node).items():
                    medians[mode].append(statistics.median(times))
                    samples[mode] += times
        load = max(load, os.getloadavg()[0])
    figures = {f"{mode}_us": statistics.median(values) * 1e6 for mode, values in medians.items()}
    for mode, values in samples.items():  # the fast tail: what the path costs unscheduled
        figures[f"{mode}_p10_us"] = statistics.quantiles(values, n=10)[0] * 1e6
    figures["load"] = load
    figures["direct_vs_relay"] = figures["tls-direct_us"] / figures["tls-relay_us"]
    figures["direct_vs_unix"] = figures["tls-direct_us"] / figures["unix-direct_us"]
    figures["relay_vs_unix"] = figures["tls-relay_us"] / figures["unix-relay_us"]
    figures["direct_vs_relay_p10"] = figures["tls-direct_p10_us"] / figures["tls-relay_p10_us"]
    figures["direct_vs_unix_p10"] = figures["tls-direct_p10_us"] / figures["unix-direct_p10_us"]
    figures["relay_vs_unix_p10"] = figures["tls-relay_p10_us"] / figures["unix-relay_p10_us"]
    return figures


def render(figures: dict[str, float], requests: int, rounds: int) -> str:
    def us(mode: str) -> str:
        return f"{figures[mode + '_us']:.0f} µs | {figures[mode + '_p10_us']:.0f} µs"

    def ratio(name: str) -> str:
        return f"{figures[name]:.2f}x | {figures[name + '_p10']:.2f}x"

    return f"""{START}
## Cluster transport (TLS between hosts)

`python -m scripts.cluster.bench_cluster_tls --requests {requests} --rounds {rounds} --write-docs`
(root) on {platform.machine()} Linux, Python {platform.python_version()},
{os.cpu_count()} cores: etcd, a node and a client each in a network namespace of its own
on one bridge (veth pairs); one session; the median of {rounds} alternating rounds'
medians of {requests} keyed requests, one at a time; the two TLS paths take turns
request by request in one client process, and so do the two unix ones. The node's home is its host's
tmpfs, so the fdatasync of each request costs next to nothing: the figures are the
transport's, not the disk's. The machine's load average (1 min) reached
{figures["load"]:.1f} during the run: under load the medians are mostly waits for a CPU
(each round trip wakes two to four processes), so the fastest tenth (p10, all rounds'
requests together) is shown beside them.

| round trip of one request | median | p10 |
|---|---|---|
| another host, TLS 1.3, direct: the worker's TCP connection | {us("tls-direct")} |
| another host, TLS 1.3 at once: relayed by the TLS thread and daemon | {us("tls-relay")} |
| the node's host: its unix socket, the same relayed `send` | {us("unix-relay")} |
| the node's host: the worker's own unix connection (`Client`) | {us("unix-direct")} |
| TCP direct / TCP relayed | {ratio("direct_vs_relay")} |
| TCP direct / unix direct | {ratio("direct_vs_unix")} |
| TCP relayed / unix relayed | {ratio("relay_vs_unix")} |

On the direct path a request goes from the client's TLS connection straight to the
worker, which holds the TCP socket and makes the TLS handshake itself; relayed, it
passes the node's TLS thread, its control socket and the daemon's relay
(docs/scaling.md, "How the port is served"). What remains between the TCP direct path
and the unix one is TLS and the veth hops between the namespaces.
{END}"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    problem = namespaces_problem()
    if problem is not None:
        raise SystemExit(f"bench_cluster_tls: {problem}")
    with tempfile.TemporaryDirectory(prefix="loopd-tls-bench-") as root:
        figures = bench(Path(root), args.requests, args.rounds)
    text = render(figures, args.requests, args.rounds)
    print(text)
    if args.write_docs:
        write_section(TAG, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
