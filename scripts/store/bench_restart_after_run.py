"""Restart after a long run: a worker that appended a whole log since its open, SIGKILLed.

    python -m scripts.store.bench_restart_after_run COMMIT [--rounds N] [--requests N]

A session is created empty and served; its worker applies ``--requests`` keyed requests
of the default App (four records each, no epoch change: the budget is out of reach) and
is SIGKILLed; the time from the kill to the next keyed request answered (relayed by the
daemon, retried as a client does) is measured. The open after the kill is the first
since the session's create, so without a summary its writer kept it scans the whole
log. COMMIT is checked out into a temporary git worktree and the two trees take turns,
round by round, in the same run (the machines are shared and noisy); each round is a
fresh home on ``--dir`` (tmpfs by default: the restart reads the page cache either way).
Each tree starts its serve with its own ``scripts.harness.serve`` (COMMIT must have one).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TREE = Path(__file__).resolve().parents[2]
GIT = shutil.which("git") or "git"
TMPFS = "/dev/shm"  # noqa: S108 - a private mkdtemp inside it, removed afterwards

PROBE = """
import json, os, signal, sys, time
from scripts.harness.serve import start_serve, stop_serve
from supervisor.client import Client, call, call_with_retry
home, requests = sys.argv[1], int(sys.argv[2])
serve = start_serve(home, "--stable-after", "0")
try:
    call(home, "create", session="big")
    with Client(home) as client:
        for n in range(requests):
            client.send("big", f"request {n} of a long run", key=f"r{n}")
    pid = int(call(home, "status", session="big")[0]["pid"])
    size = os.path.getsize(os.path.join(home, "sessions", "big", "0.jsonl"))
    start = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    call_with_retry(home, "send", session="big", text="after the kill", key="after",
                    deadline=time.monotonic() + 60)
    took = time.perf_counter() - start
    print(json.dumps({"restart_ms": took * 1000, "log_bytes": size}))
finally:
    stop_serve(serve)
"""


def probe(tree: Path, home: str, requests: int) -> dict[str, float]:
    """One round in ``tree``: serve, a long run, a SIGKILL; the restart's figures."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, home, str(requests)],
        cwd=tree, env=env, capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commit")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=2500)
    parser.add_argument("--dir", default=TMPFS if os.path.isdir(TMPFS) else None)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="loopd-restart-run-", dir=args.dir)
    old = Path(root) / "old-tree"
    subprocess.run([GIT, "-C", str(TREE), "worktree", "add", "--detach", str(old), args.commit],
                   check=True, capture_output=True)  # fmt: skip
    sides = {"before": old, "after": TREE}
    times: dict[str, list[float]] = {side: [] for side in sides}
    sizes: list[float] = []
    try:
        for r in range(args.rounds):
            for side in list(sides) if r % 2 == 0 else list(sides)[::-1]:
                home = os.path.join(root, f"{side}-{r}")
                figures = probe(sides[side], home, args.requests)
                times[side].append(figures["restart_ms"])
                sizes.append(figures["log_bytes"])
                shutil.rmtree(home, ignore_errors=True)
    finally:
        subprocess.run([GIT, "-C", str(TREE), "worktree", "remove", "--force", str(old)],
                       check=False, capture_output=True)  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)
    before, after = statistics.median(times["before"]), statistics.median(times["after"])
    print(f"log at the kill: {statistics.median(sizes):.0f} bytes, {args.requests} requests")
    for side in sides:
        values = ", ".join(f"{v:.1f}" for v in times[side])
        print(f"{side}: median {statistics.median(times[side]):.1f} ms ({values})")
    print(f"after / before: {after / before:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
