"""Benchmark the chaos rig: cases per second for the full sweep of scenario 1.

python -m scripts.chaos.bench_chaos [--jobs N] [--write-docs]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from chaos.sweep.parallel import case_workdir, run_cases
from chaos.sweep.sweep import ALL_FAULTS, build_cases
from scripts.harness.benchmarks_doc import write_section
from scripts.harness.machine import machine_line


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
        f"Command: `python -m scripts.chaos.bench_chaos --jobs {args.jobs}`  ",
        f"{machine_line()}; case homes under {os.path.dirname(on)}.",
        "",
        "| measure | figure | goal |",
        "|---|---|---|",
        *rows,
        "",
        "<!-- chaos-bench:end -->",
    ])  # fmt: skip
    print(section)
    if args.write_docs:
        write_section("chaos-bench", section)
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
