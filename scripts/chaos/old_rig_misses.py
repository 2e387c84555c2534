"""Run the mutants of issue 19 against a rig without the additions that catch them.

    git archive 9350fcb | tar -x -C OLD       # the rig before the additions
    cp chaos/mutants/unseen.py OLD/chaos/mutants/
    cd OLD && PYTHONPATH=OLD python PATH/TO/scripts/chaos/old_rig_misses.py [MUTANT ...]

Each mutant is scored on broad selections of the old rig's own scenarios and faults
(no compounds), the way ``loopd chaos mutants --quick`` scores a mutant: a case counts
as a catch only where the real store holds it. It prints how many cases caught each.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import chaos
from chaos.faults.hook import FaultKind
from chaos.mutants import MUTANTS, Mutant, unseen
from chaos.report.scoring import score_mutant

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ALL = (FaultKind.KILL, FaultKind.TORN, FaultKind.POWER, FaultKind.IO, FaultKind.SHORT)
KILL_IO = (FaultKind.KILL, FaultKind.IO)
PLAN = {
    "key-index-search-off-by-one": (
        unseen.key_index_search_off_by_one, ("requests", "operator"), ALL,
    ),
    "commit-resets-call-counter": (
        unseen.commit_resets_call_counter, ("basic", "resume", "legacy", "requests"), KILL_IO,
    ),
    "lease-read-before-write-only": (unseen.lease_read_before_write_only, ("requests",), KILL_IO),
    "commit-failure-fails-request": (
        unseen.commit_failure_fails_request, ("requests", "operator"),
        (FaultKind.KILL, FaultKind.IO, FaultKind.SHORT),
    ),
    "create-follows-links": (unseen.create_follows_links, ("basic", "resume", "legacy"), ALL),
}  # fmt: skip


def main() -> None:
    if os.path.abspath(chaos.__file__).startswith(HERE + os.sep):
        sys.exit("run it with the old rig first on PYTHONPATH (see the docstring)")
    for name, (patch, scenarios, faults) in PLAN.items():
        if len(sys.argv) > 1 and name not in sys.argv[1:]:
            continue
        MUTANTS[name] = Mutant(name=name, bug=name, patch=patch, caught_by="-", faults=faults,
                               scenarios=scenarios)  # fmt: skip
        started = time.monotonic()
        with tempfile.TemporaryDirectory() as workdir:
            score = score_mutant(name, workdir, jobs=2, quick=True)
        print(
            f"{name}: {score.cases} cases of {','.join(scenarios)} x "
            f"{','.join(f.value for f in faults)}; caught by {len(score.caught)} "
            f"{dict(score.invariants)} ({time.monotonic() - started:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
