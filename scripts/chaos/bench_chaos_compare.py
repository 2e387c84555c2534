"""The chaos rig side by side with an older commit: distinct crash states checked per second.

    python -m scripts.chaos.bench_chaos_compare COMMIT [--rounds N] [--jobs N] [--scenario S ...]

Checks COMMIT out into a temporary git worktree and runs, alternating between it and
this tree in the same run (the machines are shared and noisy), the default
``loopd chaos run`` (every fault kind, every compound) of the chosen scenarios, each
with ``--json-report``. Both run the same cases (the script checks the ids), so the
distinct crash states are those this tree's report counts; states per second is that
count over each run's wall time (the clean runs that count boundaries included).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TREE = Path(__file__).resolve().parents[2]
GIT = shutil.which("git") or "git"


def chaos_run(tree: Path, report: Path, jobs: int, scenarios: list[str]) -> float:
    """Wall seconds of ``loopd chaos run`` of ``scenarios`` in ``tree``."""
    picked = [arg for name in scenarios for arg in ("--scenario", name)]
    began = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "supervisor", "chaos", "run", *picked, "--jobs", str(jobs),
         "--json-report", str(report)],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, check=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commit")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--scenario", action="append", default=None)
    args = parser.parse_args()
    scenarios = args.scenario or []
    with tempfile.TemporaryDirectory(prefix="loopd-compare-") as tmp:
        old = Path(tmp) / "old"
        subprocess.run([GIT, "worktree", "add", "-q", "--detach", str(old), args.commit],
                       cwd=TREE, check=True)  # fmt: skip
        try:
            for round_no in range(1, args.rounds + 1):
                walls: dict[str, float] = {}
                reports: dict[str, Path] = {}
                for name, tree in ((args.commit[:10], old), ("this tree", TREE)):
                    reports[name] = Path(tmp) / f"{round_no}-{len(walls)}.json"
                    walls[name] = chaos_run(tree, reports[name], args.jobs, scenarios)
                old_doc, new_doc = (json.loads(reports[n].read_text()) for n in walls)
                old_ids = sorted(c["id"] for c in old_doc["cases"])
                new_ids = sorted(c["id"] for c in new_doc["cases"])
                if old_ids != new_ids:
                    print(f"round {round_no}: the two trees ran different cases "
                          f"({len(old_ids)} and {len(new_ids)})")  # fmt: skip
                states = new_doc["distinct_states"]
                rates = {n: states / w for n, w in walls.items()}
                print(json.dumps({
                    "round": round_no, "cases": len(new_ids), "distinct_states": states,
                    "wall_s": {n: round(w, 1) for n, w in walls.items()},
                    "states_per_s": {n: round(r, 2) for n, r in rates.items()},
                    "violations": {"old": old_doc["violations"], "new": new_doc["violations"]},
                    "ratio": round(rates["this tree"] / rates[args.commit[:10]], 2),
                }), flush=True)  # fmt: skip
        finally:
            subprocess.run([GIT, "worktree", "remove", "--force", str(old)], cwd=TREE,
                           check=False)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
