"""Compare what starting an interpreter for loopd costs in imports with an older commit.

    python -m scripts.supervisor.bench_imports OLD [NEW] [--rounds N]

OLD and NEW (default: this working tree) are unpacked with ``git archive`` (the working
tree: its tracked files copied as they are now) into a temporary directory, the
repository untouched, byte-compiled there as an installed package is, and measured
alternately in the
same run (the machines are shared and noisy): for each command, ``python -X importtime``
with the tree first on ``sys.path``, and the sum of the cumulative microseconds of
every top-level import the command made after ``site`` (for ``from worker import
Session``: the ``worker`` line's cumulative figure). Prints the median of each, the
ratio NEW/OLD, and the loopd modules each command loaded.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

TREE = Path(__file__).resolve().parents[2]
GIT = shutil.which("git") or "git"
_CLI = (
    "import sys; sys.argv = ['loopd', {args}]\n"
    "from supervisor.cli import main\n"
    "try:\n    main()\nexcept SystemExit:\n    pass\n"
)
COMMANDS = {
    "from worker import Session": "from worker import Session",
    "from supervisor.client import Client": "from supervisor.client import Client",
    "loopd status (no daemon)": _CLI.format(args="'status', '--home', '/nonexistent'"),
    "loopd --help": _CLI.format(args="'--help'"),
}
_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( +)(\S+)")
_LOADED = (
    "\nimport sys\n"
    "print(sum(m.split('.')[0] in ('worker', 'supervisor', 'chaos') for m in sys.modules))"
)


def unpack(commit: str, into: Path) -> Path:
    """The tree of ``commit`` in ``into`` (``git archive``: no worktree, no index touched)."""
    archive = subprocess.run([GIT, "archive", commit], cwd=TREE, capture_output=True, check=True)
    into.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return compiled(into)


def copy_working_tree(into: Path) -> Path:
    """The working tree's tracked files as they are now, in ``into``.

    Not the tree itself: with ``PYTHONDONTWRITEBYTECODE`` set (or a tree that cannot be
    written) it holds no byte code, and every measured interpreter would compile the
    sources, which doubled the figure against an unpacked commit's.
    """
    listed = subprocess.run(
        [GIT, "ls-files", "-z"], cwd=TREE, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, (os.fsdecode(raw) for raw in listed)):
        source = TREE / name
        if source.is_file():  # a tracked file deleted in the working tree is absent
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return compiled(into)


def compiled(into: Path) -> Path:
    """``into`` with its byte code written once, as an installed package has it."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(into)], check=True)
    return into


def import_us(tree: Path, code: str) -> int:
    """Microseconds of the imports ``code`` makes, run with ``tree`` first on sys.path."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    total, after_site = 0, False
    for line in done.stderr.splitlines():
        match = _LINE.match(line)
        if match is None or len(match[3]) != 1:
            continue  # a nested import: counted in its top-level parent's figure
        if after_site:
            total += int(match[2])
        after_site = after_site or match[4] == "site"
    return total


def loaded(tree: Path, code: str) -> int:
    """How many modules of loopd ``code`` leaves imported."""
    done = subprocess.run(
        [sys.executable, "-c", code + _LOADED],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(done.stdout.split()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new", nargs="?", default=None)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loopd-imports-") as tmp:
        trees = {
            "old": unpack(args.old, Path(tmp) / "old"),
            "new": (
                copy_working_tree(Path(tmp) / "new")
                if args.new is None
                else unpack(args.new, Path(tmp) / "new")
            ),
        }
        figures: dict[tuple[str, str], list[int]] = {}
        for _round in range(args.rounds):
            for name, code in COMMANDS.items():
                for side, tree in trees.items():
                    figures.setdefault((name, side), []).append(import_us(tree, code))
        print(f"old {args.old}, new {args.new or 'working tree'}, {args.rounds} rounds, "
              f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
        print("| command | old ms | new ms | new/old | loopd modules old -> new |")
        print("|---|---:|---:|---:|---:|")
        for name, code in COMMANDS.items():
            old = statistics.median(figures[name, "old"]) / 1000
            new = statistics.median(figures[name, "new"]) / 1000
            modules = f"{loaded(trees['old'], code)} -> {loaded(trees['new'], code)}"
            print(f"| `{name}` | {old:.1f} | {new:.1f} | {new / old:.2f}x | {modules} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
