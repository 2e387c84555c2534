"""Slices of scripts/floors: bench_floors.py's relays carry real requests to a real
PostgreSQL and a real worker, beside loopd and each goal's reference; worker_costs.py
measures each part of a worker's request against a real server.

The figures are never asserted (the box is shared): what is checked is that every side
ran and the section says so, so that the floors in docs/benchmarks.md stay measurable.
The file part needs ``redis-server`` (not installed by ``.ci/run``) and is not run here.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.harness.postgres_server import postgres_bin
from tests.harness.support import REPO


@pytest.mark.timeout(240)
def test_the_floors_relays_carry_requests_beside_loopd_and_the_references() -> None:
    postgres_bin()  # skipped without PostgreSQL (a failure under CI, which installs it)
    done = subprocess.run(
        [sys.executable, "-m", "scripts.floors.bench_floors", "--rounds", "1",
         "--requests", "20", "--parts", "postgres,http"],
        cwd=REPO, capture_output=True, text=True, timeout=220, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    section = done.stdout
    rows = [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ")]
    assert rows.count("side") == 2, section
    for side in ("bare INSERT + COMMIT", "relay", "loopd", "Client.send", "HTTP port"):
        assert side in rows, (side, section)
    assert rows.count("relay") == 2, section
    assert "skipped" not in section, section
    assert "CPU a request of the process in the middle: relay" in section, section


@pytest.mark.timeout(240)
def test_the_worker_costs_measure_each_part_against_a_real_server() -> None:
    postgres_bin()
    done = subprocess.run(
        [sys.executable, "-m", "scripts.floors.worker_costs", "--requests", "30"],
        cwd=REPO, capture_output=True, text=True, timeout=220, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    rows = [
        line.split("|")[1:4] for line in lines if line.startswith("| ") and "| µs |" not in line
    ]
    parts = [part.strip() for part, _measure, _value in rows]
    assert parts.count("server") == 3, done.stdout
    assert parts.count("hot") == 3, done.stdout
    assert parts.count("in place") == 5, done.stdout
    for _part, measure, value in rows:
        figures = [float(v) for v in value.replace("+", " ").split()]
        assert figures, (measure, done.stdout)
        # The worker's CPU comes in 10 ms ticks: 30 requests may take none of one.
        least = 0.0 if "CPU a request" in measure else 1e-9
        assert all(f >= least for f in figures), (measure, done.stdout)
