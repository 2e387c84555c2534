"""The end of a pytest run kills every process the run started that is still running.

The per-test guard in ``conftest`` kills a test's leftover children, but a process
can escape it: a worker or daemon started with ``start_new_session`` whose parent was
killed (it is re-parented to init and is no longer a descendant of the runner), or
every child of an xdist worker that died of a timeout. Every process the run starts
inherits ``LOOPD_TEST_RUN`` from the environment (the run that set it alone owns it;
xdist workers and pytest runs started by a test inherit it and reap nothing), and at
the end the owner kills every process still holding its value, however it got there.
"""

from __future__ import annotations

import os
import uuid
from typing import Final

import psutil
import pytest

RUN_VARIABLE: Final = "LOOPD_TEST_RUN"
"""The environment variable every process of one run inherits, valued the run's id."""
_OWNER: Final = pytest.StashKey[str]()
_GRACE: Final = 5.0  # seconds a killed process has to disappear before it is reported


def pytest_configure(config: pytest.Config) -> None:
    if RUN_VARIABLE not in os.environ:
        run = uuid.uuid4().hex
        os.environ[RUN_VARIABLE] = run
        config.stash[_OWNER] = run


def pytest_unconfigure(config: pytest.Config) -> None:
    run = config.stash.get(_OWNER, None)
    if run is None:
        return
    del os.environ[RUN_VARIABLE]
    left = leftovers(run)
    for proc in left:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    _gone, alive = psutil.wait_procs(left, timeout=_GRACE)
    if left:
        names = ", ".join(f"{p.pid} {_name(p)}" for p in left)
        print(f"\nkilled {len(left)} process(es) the run left running: {names}")
    if alive:
        print(f"still running after SIGKILL: {[p.pid for p in alive]}")


def leftovers(run: str) -> list[psutil.Process]:
    """Every running process but this one and its ancestors whose environment holds ``run``."""
    me = psutil.Process()
    spared = {me.pid, *(p.pid for p in me.parents())}
    found = []
    for proc in psutil.process_iter():
        if proc.pid in spared:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(RUN_VARIABLE) == run:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # gone, or not ours to read: not one this run started
    return found


def _name(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:120]
    except psutil.Error:
        return "?"
