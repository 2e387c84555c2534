"""Benchmark the chaos rig: cases per second for the full sweep of scenario 1.

python scripts/bench_chaos.py [--jobs N] [--write-docs]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

from chaos.sweep.parallel import case_workdir, run_cases
from chaos.sweep.sweep import ALL_FAULTS, build_cases

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    rows = []
    bad = 0
    with case_workdir() as workdir:
        for compound in (True, False):
            cases = build_cases(["basic"], ALL_FAULTS, workdir, compound=compound)
            start = time.perf_counter()
            results = run_cases(cases, workdir, jobs=args.jobs, on_result=lambda _r: None)
            elapsed = time.perf_counter() - start
            violations = sum(r.outcome != "ok" for r in results)
            bad += violations
            what = "kill, torn, power, io, compound" if compound else "kill, torn, power, io"
            rows.append(
                f"| full sweep of scenario `basic` ({what}) | {len(results)} cases in "
                f"{elapsed:.1f} s = **{len(results) / elapsed:.0f} cases/s**, {violations} "
                f"violations | >= 200 cases/s |"
            )
        on = workdir
    section = "\n".join([
        "<!-- chaos-bench:start -->",
        "## Chaos rig",
        "",
        f"Command: `python scripts/bench_chaos.py --jobs {args.jobs}`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; case homes under {os.path.dirname(on)}.",
        "",
        "| measure | figure | goal |",
        "|---|---|---|",
        *rows,
        "",
        "<!-- chaos-bench:end -->",
    ])  # fmt: skip
    print(section)
    if args.write_docs:
        sys.path.insert(0, str(HERE))
        from bench_store import _write_section  # noqa: PLC0415 - the sibling script's helper

        _write_section(HERE.parent / "docs" / "benchmarks.md", "chaos-bench", section)
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
