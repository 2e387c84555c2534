"""Shared fixtures: a baseline, a session factory, and a guard that no child survives."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from worker import Baseline


@pytest.fixture(autouse=True)
def no_child_survives() -> Iterator[None]:
    """Fail a test that leaves a child process of the test runner alive."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    left = [p for p in me.children(recursive=True) if p.pid not in before]
    alive = []
    for p in left:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            continue
    for p in alive:
        p.kill()
    assert not alive, f"child processes left running: {[p.pid for p in alive]}"


@pytest.fixture
def baseline() -> Baseline:
    return Baseline(system="sys", memory="", tools=[{"name": "echo"}])


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def file_digests(directory: Path | str) -> dict[str, str]:
    """Return the SHA-256 of every file under ``directory`` (to prove nothing changed)."""
    digests = {}
    for root, _dirs, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                digests[path] = hashlib.sha256(f.read()).hexdigest()
    return digests
