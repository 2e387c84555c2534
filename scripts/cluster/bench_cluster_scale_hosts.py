"""Benchmark requests/s through three hosts against one, with keyed client load.

    python -m scripts.cluster.bench_cluster_scale_hosts [--clients C] [--seconds S] [--rounds R]
                                                [--write-docs] [--json]

Needs root and iproute2: it builds the hosts of the cluster tests
(``tests/harness/netns_hosts.py``):
etcd, nodes ``n0``, ``n1``, ``n2`` and a client, each a network namespace of its own on
one bridge. Two sets of C sessions are created (placed with cordons): one all on
``n0``, one spread over the three nodes. In alternating rounds (one, three, three,
one, ...) the client host runs C client processes, one per session of a set, each
sending keyed requests one at a time through its own ``ClusterClient`` for S seconds
(``scripts/cluster/bench_hosts_load.py``). The figure is the ratio of the median rates, with
per-request p50 and p99 of every round pooled. ``--write-docs`` replaces its section of
docs/benchmarks.md.
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
from tests.harness.netns_cluster import private_files, run_client, start_etcd, start_node
from tests.harness.netns_hosts import Host, Hosts, namespaces_problem
from tests.harness.tls_certs import Certificates

NODES = ("n0", "n1", "n2")
TAG = "cluster-hosts-scale-bench"
START, END = f"<!-- {TAG}:start -->", f"<!-- {TAG}:end -->"


def placements(url: str, clients: int) -> tuple[list[dict[str, object]], list[str], list[str]]:
    """The client's steps creating both sets (each node but the wanted one cordoned)."""
    one = [f"one{n}" for n in range(clients)]
    three = [f"three{n}" for n in range(clients)]
    wanted = {s: "n0" for s in one} | {s: NODES[n % 3] for n, s in enumerate(three)}
    steps: list[dict[str, object]] = [
        {"loopd": ["cordon", "--cluster", url, other]} for other in NODES[1:]
    ]
    for n, node in enumerate(NODES):
        if n > 0:  # only ``node`` open: the one before it cordoned, it uncordoned
            steps += [{"loopd": ["uncordon", "--cluster", url, node]},
                      {"loopd": ["cordon", "--cluster", url, NODES[n - 1]]}]  # fmt: skip
        steps += [{"create": s} for s, there in wanted.items() if there == node]
    steps += [{"loopd": ["uncordon", "--cluster", url, node]} for node in NODES[:-1]]
    steps.append({"loopd": ["status", "--cluster", url, "--json"]})
    return steps, one, three


def load(client: Host, url: str, seconds: float, sessions: list[str]) -> dict[str, object]:
    files = private_files(client)
    env = [f"LOOPD_TLS_CA={files.ca}", f"LOOPD_TLS_CERT={files.cert}",
           f"LOOPD_TLS_KEY={files.key}"]  # fmt: skip
    load = ("-m", "scripts.cluster.bench_hosts_load", url, str(seconds), ",".join(sessions))
    argv = client.python(*load)
    done = client.run(["env", *env, *argv], copy=client.root / "certs", timeout=seconds + 300)
    if done.returncode != 0:
        raise SystemExit(f"the client load failed: {done.stderr.strip()[-2000:]}")
    result: dict[str, object] = json.loads(done.stdout)
    return result


def bench(root: Path, clients: int, seconds: float, rounds: int) -> dict[str, float]:
    certs = Certificates(root / "ca")
    with Hosts(root / "hosts") as hosts:
        etcd_host = hosts.add("etcd")
        nodes = [hosts.add(name) for name in NODES]
        client = hosts.add("client")
        url = start_etcd(etcd_host)
        for host, name in zip(nodes, NODES, strict=True):
            start_node(host, name, url, certs)
        steps, one, three = placements(url, clients)
        done = run_client(client, certs, url, list(NODES), steps)
        problems = [s for s in done if "error" in s or s.get("code", 0) != 0]
        if problems:
            raise SystemExit(f"placing the sessions failed: {problems[0]}")
        rows = {row["session"]: row["node"] for row in json.loads(done[-1]["stdout"])}
        if {rows[s] for s in one} != {"n0"} or {rows[s] for s in three} != set(NODES):
            raise SystemExit(f"the sessions were not placed as asked: {rows}")
        rates: dict[str, list[float]] = {"one": [], "three": []}
        times: dict[str, list[float]] = {"one": [], "three": []}
        for n in range(rounds):
            order = ("one", "three") if n % 2 == 0 else ("three", "one")
            for name in order:
                result = load(client, url, seconds, one if name == "one" else three)
                rates[name].append(float(str(result["requests"])) / float(str(result["seconds"])))
                times[name] += result["times"]  # type: ignore[arg-type]
    figures = {f"{name}_rate": statistics.median(values) for name, values in rates.items()}
    for name, values in times.items():
        cuts = statistics.quantiles(values, n=100)
        figures[f"{name}_p50_ms"], figures[f"{name}_p99_ms"] = cuts[49] * 1e3, cuts[98] * 1e3
    figures["ratio"] = figures["three_rate"] / figures["one_rate"]
    return figures


def render(f: dict[str, float], clients: int, seconds: float, rounds: int, load: str) -> str:
    return f"""{START}
## Cluster: requests/s through three hosts against one

Goal: what spreading sessions over three hosts instead of one does to the requests/s a
client host gets through `ClusterClient` (etcd read once per session, then straight to
the owning node), and to each request's p50 and p99.

`python -m scripts.cluster.bench_cluster_scale_hosts --clients {clients} --seconds {seconds:g}
--rounds {rounds} --write-docs` (root) on {platform.machine()} Linux,
Python {platform.python_version()}, {os.cpu_count()} cores, load average {load} at the
start (other work shared the cores): etcd, three nodes and a client, each a network
namespace of its own on one bridge. {clients} client processes on the client host, each with its own
`ClusterClient` and one session of its own, send keyed requests one at a time for
{seconds:g} s; the sessions are all on one node, or spread over the three (placed
with cordons), in alternating rounds ({rounds} of each). Medians of the rounds' rates;
round trips of every round pooled.

| sessions on | requests/s | p50 | p99 |
|---|---|---|---|
| one node | {f["one_rate"]:.0f} | {f["one_p50_ms"]:.2f} ms | {f["one_p99_ms"]:.2f} ms |
| three nodes | {f["three_rate"]:.0f} | {f["three_p50_ms"]:.2f} ms | {f["three_p99_ms"]:.2f} ms |
| three / one | {f["ratio"]:.2f}x | | |

The path measured is `ClusterClient.send`: a preamble naming the session, then mutual
TLS with the owning node's worker itself, the node's TLS thread having handed it the
connection (docs/scaling.md, "How the port is served"). The three "hosts" share this
machine's {os.cpu_count()} cores (and the client's processes run on them too), so this
is what the cluster's routing and data path allow on one box, not a scale-out across
machines. Each node's home is a tmpfs, so a request's fdatasync costs
next to nothing.
{END}"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args()
    problem = namespaces_problem()
    if problem is not None:
        raise SystemExit(f"bench_cluster_scale_hosts: {problem}")
    if args.clients < 3 or args.seconds <= 0 or args.rounds < 1:
        raise SystemExit("bench_cluster_scale_hosts: --clients >= 3, --seconds > 0, --rounds >= 1")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="loopd-scale-bench-") as root:
        figures = bench(Path(root), args.clients, args.seconds, args.rounds)
    text = render(figures, args.clients, args.seconds, args.rounds, load)
    print(text)
    if args.json:
        print(json.dumps(figures))
    if args.write_docs:
        write_section(TAG, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
