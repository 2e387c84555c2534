"""Hosts for the cluster tests: the harness of ``chaos/cluster/netns_hosts.py``, skipping.

Each host is a network namespace on a bridge namespace with a private home
(``chaos.cluster.netns_hosts``, which ``loopd chaos cluster`` uses too). Here ``Hosts`` first
checks that this machine can make them: without root or ``ip``/``unshare`` a test skips
with the reason, and fails under ``CI=true``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chaos.cluster.netns_hosts import (
    IP,
    NSENTER,
    PRIVATE,
    REPO,
    SETUP_TIMEOUT,
    HarnessError,
    Host,
    namespaces_problem,
)
from chaos.cluster.netns_hosts import Hosts as _Hosts

__all__ = [
    "IP",
    "NSENTER",
    "PRIVATE",
    "REPO",
    "SETUP_TIMEOUT",
    "HarnessError",
    "Host",
    "Hosts",
    "namespaces_problem",
    "require_namespaces",
]


def require_namespaces() -> None:
    """Skip (fail under CI=true) when this machine cannot make the test's hosts."""
    problem = namespaces_problem()
    if problem is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"the host harness cannot run: {problem}")
    pytest.skip(f"the host harness cannot run: {problem}")


class Hosts(_Hosts):
    """``chaos.cluster.netns_hosts.Hosts``, skipping (failing under CI=true) where it cannot run."""

    def __init__(self, root: Path, net: int = 77) -> None:
        require_namespaces()
        super().__init__(root, net)
