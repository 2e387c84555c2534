"""Run scripts.postgres.bench_postgres for an older commit and for this tree in turns.

    python -m scripts.postgres.bench_postgres_compare COMMIT [--new COMMIT] [--runs N]
                                                      [BENCH ARGS...]

COMMIT's files are taken with ``git archive`` into a temporary directory (and so are
``--new``'s, else this tree is measured as it is, uncommitted changes included), and
this tree's ``scripts/`` is copied over theirs, so both sides run the same
benchmark (the same references, the same bytes) and differ only in the code measured. The runs
alternate (old, new, new, old, ...), each a whole ``bench_postgres`` with its own
PostgreSQL, the side's tree first on ``PYTHONPATH``; the table gives every run's ratios,
in order, so a figure moved by other work on a shared machine shows as one run apart.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

TREE = Path(__file__).resolve().parents[2]
GIT = shutil.which("git") or "git"


def checkout(commit: str, into: Path) -> None:
    """COMMIT's files into ``into`` (no work tree of git's: nothing to clean up in .git)."""
    into.mkdir()
    archive = subprocess.run(
        [GIT, "-C", str(TREE), "archive", "--format=tar", commit],
        capture_output=True,
        check=True,
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as files:
        files.extractall(into, filter="data")
    # The benchmark and what it imports of its own: the same on both sides.
    shutil.copytree(TREE / "scripts", into / "scripts", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip


def run(tree: Path, args: list[str], out: Path) -> dict[str, list[float]]:
    """One whole benchmark of ``tree``; its per-round ratios."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    subprocess.run(
        [sys.executable, "-m", "scripts.postgres.bench_postgres", "--json", str(out), *args],
        cwd=tree,
        env=env,
        stdout=subprocess.DEVNULL,
        check=True,
    )
    ratios: dict[str, list[float]] = json.loads(out.read_text())["ratios"]
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commit")
    parser.add_argument("--new", default=None, help="a commit to measure instead of this tree")
    parser.add_argument("--runs", type=int, default=3, help="whole benchmarks per side")
    known, bench_args = parser.parse_known_args()
    root = Path(tempfile.mkdtemp(prefix="loopd-bench-pg-compare-"))
    try:
        sides = {known.commit[:12]: root / "old", "this tree": TREE}
        checkout(known.commit, sides[known.commit[:12]])
        if known.new is not None:
            del sides["this tree"]
            sides[known.new[:12]] = root / "new"
            checkout(known.new, sides[known.new[:12]])
        found: dict[str, list[dict[str, list[float]]]] = {side: [] for side in sides}
        for n in range(known.runs):
            order = list(sides) if n % 2 == 0 else list(sides)[::-1]
            for side in order:
                found[side].append(run(sides[side], bench_args, root / "figures.json"))
                print(f"run {n + 1}: {side} done", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    keys = list(next(iter(found.values()))[0])
    print("| ratio (median of its rounds) | " + " | ".join(sides) + " |")
    print("|---|" + "---|" * len(sides))
    for key in keys:
        cells = []
        for side in sides:
            per_run = [statistics.median(figures[key]) for figures in found[side]]
            cells.append(", ".join(f"{value:.2f}x" for value in per_run))
        print(f"| {key} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
