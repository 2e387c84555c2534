"""A slice of scripts/supervisor/bench_timers.py: schedules across sessions under worker SIGKILLs
and a supervisor killed and restarted, each delivered once and none early.

The full run (1,000 schedules, 100 sessions) is ``-m bench_timers``; its figures are in
docs/benchmarks.md. Lateness is a figure, never asserted (the box is shared).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.harness.support import REPO


def _bench(*argv: str, timeout: float) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "scripts.supervisor.bench_timers", *argv],
        cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    figures: dict[str, object] = json.loads(done.stdout.rstrip().splitlines()[-1])
    return figures


@pytest.mark.timeout(300)
def test_a_slice_of_the_timers_benchmark_delivers_every_schedule_once_and_none_early() -> None:
    figures = _bench("--sessions", "6", "--per-session", "3", "--kills", "2",
                     "--ahead", "2", "6", timeout=280)  # fmt: skip
    assert figures["missing"] == 0, figures
    assert figures["delivered_twice_or_more"] == 0, figures
    assert figures["early"] == 0, figures
    assert figures["delivered_once"] == 18, figures


@pytest.mark.bench_timers
@pytest.mark.timeout(1800)
def test_the_full_timers_benchmark_delivers_1000_schedules_once_and_none_early() -> None:
    figures = _bench(timeout=1700)
    assert figures["delivered_once"] == 1000, figures
    assert figures["early"] == 0, figures
