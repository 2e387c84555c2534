"""Spreading cases over cores: a pool of forked rig processes, each forking its cases."""

from __future__ import annotations

import gc
import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager

from chaos.cases import Case, CaseResult
from chaos.runner import run_case

_workdir = ""
# mkdtemp makes a fresh 0700 directory of its own there, so a shared tmpfs is safe.
SHM = "/dev/shm"  # noqa: S108


@contextmanager
def case_workdir(base: str | None = None) -> Iterator[str]:
    """A scratch directory for case homes, removed afterwards.

    By default on tmpfs (/dev/shm) when there is one: the rig models durability itself
    (boundaries and the power-loss model), so the real disk's fsync adds only time.
    """
    if base is None and os.path.isdir(SHM) and os.access(SHM, os.W_OK):
        base = SHM
    path = tempfile.mkdtemp(prefix="loopd-chaos-", dir=base)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _init(workdir: str) -> None:
    global _workdir  # noqa: PLW0603 - one pool process, one scratch directory
    _workdir = workdir
    gc.freeze()


def _run(case: Case) -> CaseResult:
    root = tempfile.mkdtemp(prefix="batch-", dir=_workdir)
    try:
        return run_case(case, root, crash_cache=_workdir)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_cases(
    cases: list[Case],
    workdir: str,
    *,
    jobs: int,
    on_result: Callable[[CaseResult], None],
) -> list[CaseResult]:
    """Run ``cases`` on ``jobs`` processes; call ``on_result`` as each one finishes."""
    results: list[CaseResult] = []
    if jobs <= 1:
        _init(workdir)
        for case in cases:
            result = _run(case)
            on_result(result)
            results.append(result)
        return results
    # fork: the pool processes inherit the warm rig (modules, counted boundaries).
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_init,
                             initargs=(workdir,)) as pool:  # fmt: skip
        for result in pool.map(_run, cases, chunksize=8):
            on_result(result)
            results.append(result)
    return results
