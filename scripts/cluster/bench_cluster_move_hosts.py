"""Benchmark a move between hosts that share nothing, against a raw TCP copy of its files.

    python -m scripts.cluster.bench_cluster_move_hosts [--records N] [--rounds R]
                                               [--against COMMIT] [--write-docs] [--json]

Needs root and iproute2: it builds the hosts of the cluster tests
(``tests/harness/netns_hosts.py``):
etcd, nodes ``a`` and ``b`` and an operator, each a network namespace of its own on one
bridge, each node's home a tmpfs of its own mount namespace. One session of N records
(requests of four, one group commit each) moves back and forth between the nodes, driven
from the operator's host (``move_remote``: the target pulls the sealed copy over mutual
TLS). In alternating rounds, before each move, the reference copies the same files
between the same two namespaces over the same bridge: a plain socket sender and
receiver of the standard library (``scripts/cluster/bench_hosts_side.py``), the receiver
fdatasyncing each file and fsyncing the directory. The figure is the ratio of medians,
with where the move's time went. ``--against COMMIT`` adds nodes ``c`` and ``d`` running
COMMIT's code (extracted with ``git archive``), which move a session of the same size
in the same rounds: a before/after in one run. ``--write-docs`` replaces its section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import tarfile
import tempfile
from pathlib import Path

from scripts.harness.benchmarks_doc import REPO, write_section
from supervisor.cluster.transport import Role
from tests.harness.netns_cluster import (
    host_certificates,
    node_address,
    private_files,
    run_client,
    start_etcd,
    start_node,
    tls_args,
)
from tests.harness.netns_hosts import NSENTER, Host, Hosts, namespaces_problem
from tests.harness.tls_certs import Certificates

REFERENCE_PORT = 7600
TAG = "cluster-hosts-move-bench"
START, END = f"<!-- {TAG}:start -->", f"<!-- {TAG}:end -->"
NodeProcess = subprocess.Popen[bytes]
Pair = dict[str, tuple[Host, NodeProcess]]


def side(host: Host, node: NodeProcess, *args: str, timeout: float = 300) -> dict[str, object]:
    """``scripts.cluster.bench_hosts_side`` run in the namespaces of ``node`` (it sees its home)."""
    done = host.inside(node, host.python("-m", "scripts.cluster.bench_hosts_side", *args),
                       timeout=timeout)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{args[0]} on {host.name} failed: {done.stderr.strip()[-2000:]}")
    result: dict[str, object] = json.loads(done.stdout)
    return result


def loopd(host: Host, node: NodeProcess, *args: str) -> None:
    home = str(host.private / "home")
    done = host.inside(node, host.python("-m", "supervisor", args[0], "--home", home, *args[1:]))
    if done.returncode != 0:
        raise SystemExit(f"loopd {args[0]} on {host.name}: {done.stderr.strip()[-2000:]}")


def reference_copy(
    source: tuple[Host, NodeProcess], target: tuple[Host, NodeProcess], session: str
) -> float:
    """One raw TCP copy of the session's files from ``source`` to ``target``; its seconds."""
    (src, src_node), (dst, dst_node) = source, target
    receive = ["receive", dst.address, str(REFERENCE_PORT), str(dst.private), "1"]
    argv = [NSENTER, "--target", str(dst_node.pid), "--mount", "--net",
            *dst.python("-m", "scripts.cluster.bench_hosts_side", *receive)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    receiver = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                cwd=env["PYTHONPATH"], stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        assert receiver.stdout is not None
        if receiver.stdout.readline().strip() != b"ready":
            receiver.kill()
            _out, said = receiver.communicate()
            raise SystemExit(f"the reference receiver did not start: {said!r:.300}")
        sent = side(src, src_node, "send", dst.address, str(REFERENCE_PORT),
                    str(src.private / "home" / "sessions" / session))  # fmt: skip
        _out, err = receiver.communicate(timeout=60)
        if receiver.returncode != 0:
            raise SystemExit(f"the reference receiver failed: {err.decode()[-2000:]}")
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    return float(str(sent["seconds"]))


def move(operator: Host, url: str, session: str, target: str) -> dict[str, object]:
    files = private_files(operator)
    env = [f"LOOPD_TLS_CA={files.ca}", f"LOOPD_TLS_CERT={files.cert}",
           f"LOOPD_TLS_KEY={files.key}"]  # fmt: skip
    argv = operator.python("-m", "scripts.cluster.bench_hosts_side", "move", url, session, target)
    done = operator.run(["env", *env, *argv], copy=operator.root / "certs", timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"the move to {target} failed: {done.stderr.strip()[-2000:]}")
    result: dict[str, object] = json.loads(done.stdout)
    if result["node"] != target:
        raise SystemExit(f"the move ended on {result['node']}, not {target}")
    return result


def start_node_in(host: Host, name: str, url: str, certs: Certificates, tree: Path) -> NodeProcess:
    """``start_node``, but running the code of ``tree`` (an older commit's files)."""
    copy = host_certificates(certs, host, name, Role.NODE)
    serve = host.python("-m", "supervisor", "serve", "--home", str(host.private / "home"),
                        "--cluster", url, "--node", name, "--lease-ttl", "3",
                        "--listen", node_address(host), *tls_args(private_files(host)))  # fmt: skip
    in_tree = ["sh", "-c", 'export PYTHONPATH="$0"; cd "$0" && exec "$@"', str(tree), *serve]
    return host.spawn(in_tree, log=host.root / "serve.log", copy=copy)


def build_session(operator: Host, certs: Certificates, url: str, pair: Pair, session: str,
                  records: int) -> tuple[str, object]:  # fmt: skip
    """Create ``session`` on one of ``pair`` (the other nodes cordoned), fill it with
    ``records`` records; the node holding it and its size."""
    names = list(pair)
    others = [n for n in ("a", "b", "c", "d") if n not in pair]
    cluster = ["--cluster", url]
    steps: list[dict[str, object]] = [{"loopd": ["cordon", *cluster, n]} for n in others]
    steps.append({"create": session})
    steps += [{"loopd": ["uncordon", *cluster, n]} for n in others]
    steps.append({"loopd": ["status", *cluster, "--json"]})
    made = run_client(operator, certs, url, names, steps, role=Role.OPERATOR)
    if any("error" in step or step.get("code", 0) != 0 for step in made):
        raise SystemExit(f"creating {session} failed: {made}")
    where = next(r["node"] for r in json.loads(made[-1]["stdout"]) if r["session"] == session)
    holder = pair[where]
    loopd(*holder, "stop", session)
    built = side(*holder, "build", str(holder[0].private / "home"), session, str(records))
    loopd(*holder, "start", session)
    return str(where), built["bytes"]


def bench(root: Path, records: int, rounds: int, against: Path | None) -> dict[str, object]:
    certs = Certificates(root / "ca")
    with Hosts(root / "hosts") as hosts:
        etcd_host, operator = hosts.add("etcd"), hosts.add("operator")
        url = start_etcd(etcd_host)
        pairs: dict[str, Pair] = {"new": {n: (h, start_node(h, n, url, certs)) for n, h in
                                          ((n, hosts.add(n)) for n in ("a", "b"))}}  # fmt: skip
        if against is not None:  # the same moves, by nodes running the older commit
            pairs["old"] = {n: (h, start_node_in(h, n, url, certs, against)) for n, h in
                            ((n, hosts.add(n)) for n in ("c", "d"))}  # fmt: skip
        where, size = {}, None
        for version, pair in pairs.items():
            where[version], size = build_session(operator, certs, url, pair, version, records)
        copies: dict[str, list[float]] = {version: [] for version in pairs}
        moves: dict[str, list[dict[str, object]]] = {version: [] for version in pairs}
        for n in range(rounds):  # each pair: its reference copy, then its move
            for version in sorted(pairs, reverse=n % 2 == 1):
                pair = pairs[version]
                target = next(name for name in pair if name != where[version])
                copies[version].append(reference_copy(pair[where[version]], pair[target],
                                                      version))  # fmt: skip
                moves[version].append(move(operator, url, version, target))
                where[version] = target
        holder = pairs["new"][where["new"]]
        parts = side(*holder, "parts", str(holder[0].private / "home"), "new", "5")
    return {"bytes": size, "copies": copies, "moves": moves, "parts": parts}


def _median(moves: list[dict[str, object]], group: str, name: str) -> float:
    return statistics.median(float(m[group].get(name, 0.0)) for m in moves)  # type: ignore[attr-defined]


def figures(raw: dict[str, object]) -> dict[str, float]:
    every: dict[str, list[dict[str, object]]] = raw["moves"]  # type: ignore[assignment]
    copies: dict[str, list[float]] = raw["copies"]  # type: ignore[assignment]
    out = {"bytes": float(str(raw["bytes"]))}
    for version, moves in every.items():
        tag = "" if version == "new" else f"{version}_"
        out[f"{tag}copy_ms"] = statistics.median(copies[version]) * 1e3
        for name, scale in (("seconds", 1e3), ("etcd", 1e3), ("etcd_requests", 1.0),
                            ("other", 1e3)):  # fmt: skip
            value = statistics.median(float(str(m[name])) for m in moves) * scale
            out[tag + {"seconds": "move_ms", "etcd_requests": name}.get(name, f"{name}_ms")] = value
        out[f"{tag}ratio"] = out[f"{tag}move_ms"] / out[f"{tag}copy_ms"]
        for step in ("intent", "seal", "copy", "own", "open", "release"):
            out[f"{tag}step_{step}_ms"] = _median(moves, "steps", step) * 1e3
        for op in ("connect", "stop", "seal", "pull", "adopt", "release", "forget"):
            out[f"{tag}call_{op}_ms"] = _median(moves, "calls", op) * 1e3
    parts: dict[str, float] = raw["parts"]  # type: ignore[assignment]
    for name, seconds in parts.items():
        out[f"part_{name}_ms"] = seconds * 1e3
    return out


def compared(f: dict[str, float], against: str) -> str:
    """The before/after table, when the same run also moved with nodes of ``against``."""
    if "old_move_ms" not in f:
        return ""
    rows = [("move", "move_ms"), ("raw TCP copy", "copy_ms"), ("move / copy", "ratio"),
            ("source `seal`", "call_seal_ms"),
            ("target `pull`", "call_pull_ms"), ("target `adopt`", "call_adopt_ms")]  # fmt: skip
    table = "\n".join(
        f"| {label} | {f['old_' + key]:.1f}{'x' if key == 'ratio' else ' ms'} | "
        f"{f[key]:.1f}{'x' if key == 'ratio' else ' ms'} |"
        for label, key in rows
    )
    return f"""
Before and after the source stopped reading the log a second time for the manifest
(`move_node.sealed_manifest` takes the seal's word for the very bytes it sealed, and
reads the log again if any byte differs), in the same run: a second pair of nodes, `c`
and `d`, runs the code of {against} and moves a session of the same size; in each
round each pair makes its reference copy, then its move, the pairs' order alternating
(medians):

| | before ({against}) | after |
|---|---|---|
{table}
"""


def render(f: dict[str, float], args: argparse.Namespace, load: str) -> str:
    records, rounds = args.records, args.rounds
    against = f" --against {args.against}" if args.against else ""
    return f"""{START}
## Cluster: a move between hosts that share nothing

Goal: what a move between hosts costs against what it cannot do without (a copy of the
session's files over the network, each file and the directory fsynced), and what it
spends the rest on; on one machine a move was 48x a plain copy, most of it two opens
(the section above).

`python -m scripts.cluster.bench_cluster_move_hosts --records {records} --rounds {rounds}{against}
--write-docs` (root) on {platform.machine()} Linux, Python {platform.python_version()},
{os.cpu_count()} cores, load average {load} at the start (other work shared the
cores): etcd, nodes `a` and `b` and an operator, each a network namespace of its own on
one bridge, each node's home a tmpfs in a mount namespace of its own. A
{records:,}-record session ({f["bytes"] / 1e6:.1f} MB) moves back and forth, {rounds}
moves, driven from the operator's host (`move_remote`, mutual TLS to each node; the
target pulls the sealed copy from the source node); before each move the reference
copies the same files between the same two namespaces over the same bridge (a plain
socket sender and receiver of the standard library: each file fdatasynced by the
receiver, then the directory fsynced, then one byte back). Medians. The homes are
tmpfs, so fsyncs cost next to nothing on both sides: this is the protocol's and the
transport's cost, not the disk's.

| what | median |
|---|---|
| move between hosts | {f["move_ms"]:.1f} ms |
| reference: raw TCP copy with fsyncs | {f["copy_ms"]:.1f} ms |
| move / copy | {f["ratio"]:.1f}x |

Where the move's time goes, as the operator's host sees it (median ms of each request
to a node): TLS connects to the two nodes {f["call_connect_ms"]:.1f}, source `stop`
{f["call_stop_ms"]:.1f}, source `seal` {f["call_seal_ms"]:.1f}, target `pull`
{f["call_pull_ms"]:.1f}, target `adopt` {f["call_adopt_ms"]:.1f}, source `release`
{f["call_release_ms"]:.1f} and `forget` {f["call_forget_ms"]:.1f}; the mover's own
etcd requests ({f["etcd_requests"]:.0f}: the intent, the ownership transaction, the
final delete and the reads around them) {f["etcd_ms"]:.1f}, everything else
{f["other_ms"]:.1f}. By step: intent {f["step_intent_ms"]:.1f}, seal
{f["step_seal_ms"]:.1f}, copy {f["step_copy_ms"]:.1f}, own {f["step_own_ms"]:.1f},
open {f["step_open_ms"]:.1f}, release {f["step_release_ms"]:.1f}.

Inside those requests, each part alone on a scratch copy of the session on a node's
host (median of 5): an open of the session (`Session.open`: every record of the newest
epoch read and checked) {f["part_open_ms"]:.1f} ms, the check the source makes before
it serves the files (`load_session`, the same read) {f["part_load_session_ms"]:.1f} ms,
one SHA-256 pass over the files {f["part_sha256_ms"]:.1f} ms. The seal is one open and
an append; the pull is the source's manifest (a hash of each file), the transfer in
512 KiB chunks with the target's hash as it writes, and the install; the adopt is the
target's claim (etcd's reads, then an open of the copy to write its `Owner` record) and
its new worker's own open. So three full reads of the session, the seal's, the claim's
and the worker's, are most of a move; the copy itself is a small part.
{compared(f, args.against)}{END}"""


def extract(commit: str, tree: Path) -> Path:
    """The files of ``commit`` of this repository, extracted into ``tree``."""
    git = shutil.which("git")
    if git is None:
        raise SystemExit("--against needs git on PATH")
    archive = subprocess.run([git, "-C", str(REPO), "archive", commit],
                             capture_output=True, check=False)  # fmt: skip
    if archive.returncode != 0:
        raise SystemExit(f"--against {commit}: {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as files:
        files.extractall(tree, filter="data")
    return tree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    parser.add_argument("--against", metavar="COMMIT", default=None,
                        help="also move with nodes running COMMIT's code, alternating")  # fmt: skip
    args = parser.parse_args()
    problem = namespaces_problem()
    if problem is not None:
        raise SystemExit(f"bench_cluster_move_hosts: {problem}")
    if args.records < 6 or args.rounds < 1:
        raise SystemExit("bench_cluster_move_hosts: --records >= 6 and --rounds >= 1")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="loopd-move-bench-") as root:
        tree = None if args.against is None else extract(args.against, Path(root) / "against")
        raw = bench(Path(root), args.records, args.rounds, tree)
    result = figures(raw)
    text = render(result, args, load)
    print(text)
    if args.json:
        print(json.dumps(result))
    if args.write_docs:
        write_section(TAG, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
