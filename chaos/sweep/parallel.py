"""Spreading cases over cores: a pool of forked rig processes, each forking its cases."""

from __future__ import annotations

import gc
import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager

from chaos.cases import Case, CaseResult
from chaos.lifeline import die_with_parent
from chaos.run.crash_states import StateCache
from chaos.run.runner import run_case
from chaos.sweep.sampling import Pick

_workdir = ""
_states: StateCache | None = None
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


def _init(workdir: str, dedupe: bool) -> None:
    global _workdir, _states  # noqa: PLW0603 - one pool process, one scratch directory
    _workdir = workdir
    # The verdicts of the crash states checked so far, shared by the pool's processes.
    _states = StateCache(os.path.join(workdir, "states")) if dedupe else None
    gc.freeze()


def _init_pool(parent: int, workdir: str, dedupe: bool) -> None:
    """A pool process's start: it dies with the rig (a CI timeout's SIGKILL included)."""
    die_with_parent(parent)
    _init(workdir, dedupe)


def _run(unit: Case | Pick) -> CaseResult | None:
    root = tempfile.mkdtemp(prefix="batch-", dir=_workdir)
    try:
        case = unit.expand(root) if isinstance(unit, Pick) else unit
        if case is None:
            return None  # a pick whose compound shape has no case
        return run_case(case, root, crash_cache=_workdir, states=_states)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_cases(
    cases: Sequence[Case | Pick],
    workdir: str,
    *,
    jobs: int,
    on_result: Callable[[CaseResult], None],
    dedupe: bool = True,
    stop: Callable[[int], bool] | None = None,
) -> list[CaseResult]:
    """Run ``cases`` (or a sample's picks) on ``jobs`` processes; call ``on_result`` as
    each one finishes (a pick that has no case gives no result, nor does a repeat).

    With ``dedupe`` each distinct crash state is recovered and checked once
    (``chaos.run.crash_states``). ``stop`` is asked after each unit with the number of units
    done so far (in order): once it says yes no further case starts (those already
    running finish), and the results so far return.
    """
    results: list[CaseResult] = []
    seen: set[str] = set()
    if jobs <= 1:
        _init(workdir, dedupe)
        for done, case in enumerate(cases, start=1):
            _collect(_run(case), results, seen, on_result)
            if stop is not None and stop(done):
                break
        return results
    # fork: the pool processes inherit the warm rig (modules, counted boundaries).
    context = multiprocessing.get_context("fork")
    # One case at a time when the run may stop early (a budget), so that it stops soon
    # after its time is up; else small chunks.
    chunk = 1 if stop is not None else max(1, min(8, len(cases) // (jobs * 16)))
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_init_pool,
                             initargs=(os.getpid(), workdir, dedupe)) as pool:  # fmt: skip
        for done, result in enumerate(pool.map(_run, cases, chunksize=chunk), start=1):
            _collect(result, results, seen, on_result)
            if stop is not None and stop(done):
                pool.shutdown(wait=True, cancel_futures=True)
                break
    return results


def _collect(
    result: CaseResult | None,
    results: list[CaseResult],
    seen: set[str],
    on_result: Callable[[CaseResult], None],
) -> bool:
    """Keep ``result`` unless it is none or a case already run (two picks may draw the
    same compound case); whether it was kept."""
    if result is None or result.case in seen:
        return False
    seen.add(result.case)
    on_result(result)
    results.append(result)
    return True
