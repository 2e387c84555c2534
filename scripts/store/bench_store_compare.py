"""Open and append of the session store, this tree beside an older commit, in one run.

    python -m scripts.store.bench_store_compare COMMIT [--rounds N] [--records N] [--write-docs]

Checks COMMIT out with ``git archive`` into a temporary directory and measures,
alternating between it and this tree (the machines are shared and noisy):
- ``Session.open`` of a session of N records (default 100,000) written by each tree,
  beside a bare read + ``json.loads`` loop over the same file (the ratio is the figure);
- a single ``append`` and an ``append_many`` of 64, per record, without the disk's
  fsync (``os.fdatasync`` replaced by a no-op in the probe): the store's own CPU.
Times are the probe process's CPU time (``time.process_time``), so that other work on
a shared machine does not count; each figure is the fastest of its rounds (an fsync's
wait is not CPU time: open's fsync of what it read is not in these figures).
``--write-docs`` replaces the
``store-compare`` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from scripts.harness.benchmarks_doc import REPO, write_section

GIT = shutil.which("git") or "git"

PROBE = r"""
import json, os, sys, tempfile, time, shutil
from worker import Assistant, Baseline, Session, ToolResult, Usage, User
records = int(sys.argv[1])
BASELINE = Baseline(system="bench", memory="", tools=[])
root = tempfile.mkdtemp()
home = os.path.join(root, "h")
batch = []
call = 0
with Session.create(home, "big", BASELINE) as session:
    for n in range(records - 1):
        kind = n % 4
        if kind == 0:
            batch.append(User(text=f"request {n} " + "u" * 40, key=f"k{n}"))
        elif kind == 1:
            call += 1
            batch.append(ToolResult(call=call, tool="echo", output="o" * 60, ok=True))
        elif kind == 2:
            batch.append(Assistant(text="a" * 80))
        else:
            batch.append(Usage(prompt_tokens=n, completion_tokens=10, context_tokens=n + 10))
        if len(batch) == 1000:
            session.append_many(batch)
            batch = []
    session.append_many(batch)
    log = session.log_path

def bare():
    start = time.process_time()
    with open(log, "rb") as f:
        for line in f.read().split(b"\n")[:-1]:
            json.loads(line)
    return time.process_time() - start

def opened():
    start = time.process_time()
    Session.open(home, "big").close()
    return time.process_time() - start

real_sync = os.fdatasync
os.fdatasync = lambda fd: None
record = Assistant(text="x" * 80)
group = [User(text="u" * 40), Assistant(text="a" * 80)] * 32
appends = Session.create(os.path.join(root, "a"), "a", BASELINE)

def append():
    start = time.process_time()
    for _ in range(2000):
        appends.append(Assistant(text="x" * 80))
    return (time.process_time() - start) / 2000

def append_many():
    start = time.process_time()
    for _ in range(100):
        appends.append_many(group)
    return (time.process_time() - start) / 6400

out = {"bare": 1e9, "open": 1e9, "append": 1e9, "append_many": 1e9}
for _ in range(3):
    for name, run in (
        ("bare", bare), ("open", opened), ("append", append), ("append_many", append_many)
    ):
        out[name] = min(out[name], run())
appends.close()
os.fdatasync = real_sync
shutil.rmtree(root)
print(json.dumps(out))
"""


def probe(tree: Path, records: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(records)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
    )
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commit")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    old = Path(tempfile.mkdtemp(prefix="loopd-compare-"))
    try:
        archive = subprocess.run(
            [GIT, "-C", str(REPO), "archive", args.commit], capture_output=True, check=True
        )
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(old, filter="data")
        best: dict[str, dict[str, float]] = {"old": {}, "new": {}}
        for _ in range(args.rounds):
            for name, tree in (("old", old), ("new", REPO)):
                for key, value in probe(tree, args.records).items():
                    best[name][key] = min(value, best[name].get(key, value))
    finally:
        shutil.rmtree(old, ignore_errors=True)
    for name in ("old", "new"):
        b = best[name]
        print(
            f"{name} ({args.commit if name == 'old' else 'this tree'}): "
            f"open {b['open']:.3f} s = {b['open'] / b['bare']:.2f}x the bare loop "
            f"({b['bare']:.3f} s); append {b['append'] * 1e6:.1f} us, "
            f"append_many per record {b['append_many'] * 1e6:.2f} us (no fsync)"
        )
    o, n = best["old"], best["new"]
    print(
        f"new / old: open {n['open'] / o['open']:.3f}x "
        f"(ratio to bare {n['open'] / n['bare']:.2f} vs {o['open'] / o['bare']:.2f}); "
        f"append {n['append'] / o['append']:.3f}x; "
        f"append_many {n['append_many'] / o['append_many']:.3f}x"
    )
    if args.write_docs:
        command = (
            f"python -m scripts.store.bench_store_compare {args.commit} --rounds {args.rounds}"
        )
        write_section("store-compare", _markdown(best, args.commit, args.records, command))
    return 0


def _markdown(best: dict[str, dict[str, float]], commit: str, records: int, command: str) -> str:
    o, n = best["old"], best["new"]
    rows = [
        (f"`Session.open` of {records:,} records / bare read + `json.loads` loop",
         f"{o['open'] / o['bare']:.2f}x ({o['open']:.3f} s)",
         f"{n['open'] / n['bare']:.2f}x ({n['open']:.3f} s)", "<= 1.5x"),
        ("single `append`, the store's CPU per record (fdatasync a no-op)",
         f"{o['append'] * 1e6:.1f} us", f"{n['append'] * 1e6:.1f} us", "checksums paid for"),
        ("`append_many` of 64, the store's CPU per record (fdatasync a no-op)",
         f"{o['append_many'] * 1e6:.2f} us", f"{n['append_many'] * 1e6:.2f} us",
         "checksums paid for"),
    ]  # fmt: skip
    return "\n".join(
        [
            "<!-- store-compare:start -->",
            "## Checksums: open and append beside the commit before them",
            "",
            f"Command: `{command}` (CPU time of the probe; each figure the fastest of its "
            "rounds, both trees alternating in one run)",
            "",
            f"| measure | before ({commit}) | with checksums | goal |",
            "|---|---|---|---|",
            *(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows),
            "",
            "<!-- store-compare:end -->",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
