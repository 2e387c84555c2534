"""Pick, for every mutant, the few cases of its quick selection that catch it.

    python -m scripts.chaos.pin_mutant_cases [--jobs N] [--only NAME ...]

The test suite checks each mutant with these pinned cases (``chaos/mutants/pinned.py``):
two cases that the real store passes and the mutant fails by the invariant it must
break, the first and the last such case of the mutant's whole quick selection (its
scenarios and faults, every boundary). The whole selection stays in
``pytest -m mutants_full``. Run this again when a
scenario's boundaries change (the pinned test then says a pinned case no longer
catches its mutant).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from chaos.mutants import MUTANTS
from chaos.mutants.pinned import PINNED
from chaos.report.scoring import score_mutant

OUT = Path(__file__).resolve().parents[2] / "chaos" / "mutants" / "pinned.py"
HEADER = '''"""The cases that catch each mutant, pinned for the test suite's quick check.

Written by ``python -m scripts.chaos.pin_mutant_cases``: for each mutant, the first and the
last case of its whole quick selection that the real store passes and the mutant fails
by the invariant it must break. A mutant with its own ``quick`` cases is not here.
"""

from __future__ import annotations

from typing import Final

PINNED: Final[dict[str, tuple[str, ...]]] = {
'''


def pick(name: str, jobs: int) -> tuple[str, ...]:
    mutant = MUTANTS[name]
    with tempfile.TemporaryDirectory(prefix="loopd-pin-") as workdir:
        score = score_mutant(name, workdir, jobs=jobs, quick=True, scenarios=mutant.scenarios)
    expected = mutant.caught_by + ":"
    ids = [
        r.case.partition("@")[0]
        for r in score.caught
        if any(v.startswith(expected) for v in r.violations)
    ]
    if not ids:
        raise SystemExit(f"mutant {name}: no case of its quick selection catches it as expected")
    chosen = (ids[0], ids[-1]) if len(ids) > 1 else (ids[0],)
    print(f"{name}: {len(ids)} of {score.cases} cases catch it; pinned {', '.join(chosen)}")
    return chosen


def _tuple(ids: tuple[str, ...]) -> str:
    """``ids`` as ruff formats a tuple of strings."""
    items = ", ".join(json.dumps(i) for i in ids)
    return f"({items},)" if len(ids) == 1 else f"({items})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    names = args.only or sorted(n for n, m in MUTANTS.items() if not m.quick)
    pinned = dict(PINNED)  # --only: the others stay as they are
    pinned.update((name, pick(name, args.jobs)) for name in names)
    body = "".join(
        f"    {json.dumps(name)}: {_tuple(ids)},\n" for name, ids in sorted(pinned.items())
    )
    OUT.write_text(HEADER + body + "}\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
