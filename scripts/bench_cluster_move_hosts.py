"""Benchmark a move between hosts that share nothing, against a raw TCP copy of its files.

    python -m scripts.bench_cluster_move_hosts [--records N] [--rounds R] [--write-docs]

Needs root and iproute2: it builds the hosts of the cluster tests (``tests/netns_hosts.py``):
etcd, nodes ``a`` and ``b`` and an operator, each a network namespace of its own on one
bridge, each node's home a tmpfs of its own mount namespace. One session of N records
(requests of four, one group commit each) moves back and forth between the nodes, driven
from the operator's host (``move_remote``: the target pulls the sealed copy over mutual
TLS). In alternating rounds, before each move, the reference copies the same files
between the same two namespaces over the same bridge: a plain socket sender and
receiver of the standard library (``scripts/bench_hosts_side.py``), the receiver
fdatasyncing each file and fsyncing the directory. The figure is the ratio of medians,
with where the move's time went. ``--write-docs`` replaces its section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import tempfile
from pathlib import Path

from supervisor.cluster.transport import Role
from tests.netns_cluster import private_files, run_client, start_etcd, start_node
from tests.netns_hosts import NSENTER, Host, Hosts, namespaces_problem
from tests.tls_certs import Certificates

SESSION = "big"
REFERENCE_PORT = 7600
DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
START, END = "<!-- cluster-hosts-move-bench:start -->", "<!-- cluster-hosts-move-bench:end -->"
NodeProcess = subprocess.Popen[bytes]


def side(host: Host, node: NodeProcess, *args: str, timeout: float = 300) -> dict[str, object]:
    """``scripts.bench_hosts_side`` run in the namespaces of ``node`` (it sees its home)."""
    done = host.inside(node, host.python("-m", "scripts.bench_hosts_side", *args),
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


def reference_copy(source: tuple[Host, NodeProcess], target: tuple[Host, NodeProcess]) -> float:
    """One raw TCP copy of the session's files from ``source`` to ``target``; its seconds."""
    (src, src_node), (dst, dst_node) = source, target
    receive = ["receive", dst.address, str(REFERENCE_PORT), str(dst.private), "1"]
    argv = [NSENTER, "--target", str(dst_node.pid), "--mount", "--net",
            *dst.python("-m", "scripts.bench_hosts_side", *receive)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    receiver = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                cwd=env["PYTHONPATH"], stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        assert receiver.stdout is not None
        if receiver.stdout.readline().strip() != b"ready":
            raise SystemExit(f"the reference receiver did not start: {receiver.stderr}")
        sent = side(src, src_node, "send", dst.address, str(REFERENCE_PORT),
                    str(src.private / "home" / "sessions" / SESSION))  # fmt: skip
        _out, err = receiver.communicate(timeout=60)
        if receiver.returncode != 0:
            raise SystemExit(f"the reference receiver failed: {err.decode()[-2000:]}")
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    return float(str(sent["seconds"]))


def move(operator: Host, url: str, target: str) -> dict[str, object]:
    files = private_files(operator)
    env = [f"LOOPD_TLS_CA={files.ca}", f"LOOPD_TLS_CERT={files.cert}",
           f"LOOPD_TLS_KEY={files.key}"]  # fmt: skip
    argv = operator.python("-m", "scripts.bench_hosts_side", "move", url, SESSION, target)
    done = operator.run(["env", *env, *argv], copy=operator.root / "certs", timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"the move to {target} failed: {done.stderr.strip()[-2000:]}")
    result: dict[str, object] = json.loads(done.stdout)
    if result["node"] != target:
        raise SystemExit(f"the move ended on {result['node']}, not {target}")
    return result


def bench(root: Path, records: int, rounds: int) -> dict[str, object]:
    certs = Certificates(root / "ca")
    with Hosts(root / "hosts") as hosts:
        etcd_host, a, b, operator = (hosts.add(n) for n in ("etcd", "a", "b", "operator"))
        url = start_etcd(etcd_host)
        nodes = {"a": (a, start_node(a, "a", url, certs)), "b": (b, start_node(b, "b", url, certs))}
        made = run_client(operator, certs, url, ["a", "b"], [
            {"create": SESSION}, {"loopd": ["status", "--cluster", url, "--json"]},
        ], role=Role.OPERATOR)  # fmt: skip
        if "ok" not in made[0] or made[1]["code"] != 0:
            raise SystemExit(f"create failed: {made}")
        where = json.loads(made[1]["stdout"])[0]["node"]
        holder = nodes[where]
        loopd(*holder, "stop", SESSION)
        built = side(*holder, "build", str(holder[0].private / "home"), SESSION, str(records))
        loopd(*holder, "start", SESSION)
        copies: list[float] = []
        moves: list[dict[str, object]] = []
        for _ in range(rounds):
            other = "b" if where == "a" else "a"
            copies.append(reference_copy(nodes[where], nodes[other]))
            moves.append(move(operator, url, other))
            where = other
        parts = side(*nodes[where], "parts", str(nodes[where][0].private / "home"), SESSION, "5")
    return {"bytes": built["bytes"], "copies": copies, "moves": moves, "parts": parts}


def _median(moves: list[dict[str, object]], group: str, name: str) -> float:
    return statistics.median(float(m[group].get(name, 0.0)) for m in moves)  # type: ignore[attr-defined]


def figures(raw: dict[str, object]) -> dict[str, float]:
    moves: list[dict[str, object]] = raw["moves"]  # type: ignore[assignment]
    copies: list[float] = raw["copies"]  # type: ignore[assignment]
    out = {
        "move_ms": statistics.median(float(str(m["seconds"])) for m in moves) * 1e3,
        "copy_ms": statistics.median(copies) * 1e3,
        "etcd_ms": statistics.median(float(str(m["etcd"])) for m in moves) * 1e3,
        "etcd_requests": statistics.median(float(str(m["etcd_requests"])) for m in moves),
        "other_ms": statistics.median(float(str(m["other"])) for m in moves) * 1e3,
        "bytes": float(str(raw["bytes"])),
    }
    out["ratio"] = out["move_ms"] / out["copy_ms"]
    for step in ("intent", "seal", "copy", "own", "open", "release"):
        out[f"step_{step}_ms"] = _median(moves, "steps", step) * 1e3
    for op in ("connect", "stop", "seal", "pull", "adopt", "release", "forget"):
        out[f"call_{op}_ms"] = _median(moves, "calls", op) * 1e3
    parts: dict[str, float] = raw["parts"]  # type: ignore[assignment]
    for name, seconds in parts.items():
        out[f"part_{name}_ms"] = seconds * 1e3
    return out


def render(f: dict[str, float], records: int, rounds: int, load: str) -> str:
    return f"""{START}
## Cluster: a move between hosts that share nothing

Goal: a move between hosts costs a small multiple of what it cannot do without, a copy
of the session's files over the network with an fsync of each and of the directory.

`python -m scripts.bench_cluster_move_hosts --records {records} --rounds {rounds}
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
an append; the pull is the source's check and hash (the manifest), the transfer in
512 KiB chunks with the target's hash as it writes, and the install; the adopt is the
target's claim in etcd and its new worker's open (which writes the `Owner` record).
{END}"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args()
    problem = namespaces_problem()
    if problem is not None:
        raise SystemExit(f"bench_cluster_move_hosts: {problem}")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="loopd-move-bench-") as root:
        raw = bench(Path(root), args.records, args.rounds)
    result = figures(raw)
    text = render(result, args.records, args.rounds, load)
    print(text)
    if args.json:
        print(json.dumps(result))
    if args.write_docs:
        docs = DOCS.read_text()
        pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.DOTALL)
        if pattern.search(docs):
            docs = pattern.sub(lambda _m: text, docs)
        else:
            docs = docs.replace("<!-- cluster-bench:end -->", "<!-- cluster-bench:end -->\n\n"
                                + text, 1)  # fmt: skip
        DOCS.write_text(docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
