"""The benchmarks across namespaced hosts run end to end, with tiny sizes (no timing checked).

``scripts.cluster.bench_cluster_move_hosts`` (a move between hosts against a raw TCP copy) and
``scripts.cluster.bench_cluster_scale_hosts`` (requests/s through three hosts against one) build
the hosts of ``tests/harness/netns_hosts.py``: root and iproute2 are needed, elsewhere they skip
with the reason, under ``CI=true`` they fail.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.harness.netns_hosts import require_namespaces
from tests.harness.support import REPO

pytestmark = pytest.mark.timeout(110)


def run_bench(*argv: str) -> tuple[str, dict[str, float]]:
    require_namespaces()
    done = subprocess.run(
        [sys.executable, "-m", *argv, "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=100, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    *text, last = done.stdout.rstrip().splitlines()
    figures: dict[str, float] = json.loads(last)
    return "\n".join(text), figures


def test_the_move_benchmark_moves_a_session_between_hosts_and_copies_it_raw() -> None:
    text, figures = run_bench("scripts.cluster.bench_cluster_move_hosts", "--records", "200",
                              "--rounds", "2")  # fmt: skip
    assert "| move / copy |" in text
    assert figures["move_ms"] > 0
    assert figures["copy_ms"] > 0
    assert figures["bytes"] > 200 * 60  # the records were written before the moves
    for op in ("stop", "seal", "pull", "adopt", "release"):
        assert figures[f"call_{op}_ms"] > 0, op  # each request of the move was made
    assert figures["etcd_requests"] >= 3


def test_the_throughput_benchmark_loads_one_node_and_three() -> None:
    text, figures = run_bench("scripts.cluster.bench_cluster_scale_hosts", "--clients", "3",
                              "--seconds", "0.5", "--rounds", "1")  # fmt: skip
    assert "| three / one |" in text
    assert figures["one_rate"] > 0
    assert figures["three_rate"] > 0
    assert figures["one_p50_ms"] <= figures["one_p99_ms"]
