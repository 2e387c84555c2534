"""pytest plugin (entry point ``pytest11``): the chaos cases of a user's App as test items.

``pytest --loopd-chaos=module:attribute`` (or ``loopd_chaos = module:attribute`` in the
ini file) adds one item per case of the request scenarios run through that App, so
``pytest -n auto`` shards them, ``-k`` selects them and ``--junitxml`` reports them. A
failing item shows its violations and the one line that replays it. Without the option
the plugin adds nothing and imports nothing of the rig.

``--loopd-chaos-sample N`` (ini ``loopd_chaos_sample``) collects a seeded, stratified
sample of N items instead (at least one per scenario, fault kind, boundary kind and
compound shape; ``--loopd-chaos-seed``, default 0, so that every xdist worker
collects the same items); ``--loopd-chaos-budget SECONDS`` (ini ``loopd_chaos_budget``)
leaves unrun (and unreported: no skipped items) the items that would start after that
many seconds of the session, the cheap strata first as ``loopd chaos run --budget`` does,
and prints how many it left. Cases that reach a crash state another item checked already take
its verdict (``chaos.run.crash_states``); the xdist workers of one run share those verdicts.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import TYPE_CHECKING, Final

import pytest

if TYPE_CHECKING:
    from chaos.cases import Case, CaseResult
    from chaos.run.crash_states import StateCache
    from chaos.sweep.sampling import Pick

MARKER: Final = "loopd_chaos"
_STATES: Final = "loopd_chaos_states"  # the xdist workers' shared directory of verdicts


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("loopd-chaos", "the loopd crash rig against your own App")
    group.addoption(
        "--loopd-chaos",
        metavar="MODULE:ATTR",
        default=None,
        help="add a test per chaos case of this App (importable from the working directory).",
    )
    group.addoption(
        "--loopd-chaos-faults",
        default=None,
        help="comma-separated fault kinds of those cases (default: every fault kind).",
    )
    group.addoption(
        "--loopd-chaos-sample",
        type=int,
        default=None,
        metavar="N",
        help="a seeded, stratified sample of N cases instead of every case.",
    )
    group.addoption(
        "--loopd-chaos-seed",
        type=int,
        default=None,
        help="the sample's seed (default 0: the same sample on every run and xdist worker).",
    )
    group.addoption(
        "--loopd-chaos-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="skip the cases that start after this many seconds (each stratum runs once).",
    )
    group.addoption(
        "--loopd-chaos-compound",
        action="store_true",
        help="also the compound cases (a crash of the recovery, a power loss after a resume).",
    )
    parser.addini("loopd_chaos", "the App (module:attribute) of --loopd-chaos", default="")
    parser.addini("loopd_chaos_sample", "the N of --loopd-chaos-sample", default="")
    parser.addini("loopd_chaos_budget", "the SECONDS of --loopd-chaos-budget", default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: a case of the loopd crash rig (--loopd-chaos)")
    config.stash[_STARTED] = time.monotonic()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: object) -> None:
    """xdist: hand each worker the directory where the run's workers share verdicts."""
    config = getattr(node, "config", None)
    workerinput = getattr(node, "workerinput", None)
    if config is None or workerinput is None or _app(config) is None:
        return
    workerinput[_STATES] = _states_dir(config)


def _states_dir(config: pytest.Config) -> str:
    """This run's directory of crash-state verdicts: the controller's, made once."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and _STATES in workerinput:
        return str(workerinput[_STATES])
    return os.path.join(_workdir(config), "states")


def _number(config: pytest.Config, option: str, ini: str, kind: type[float]) -> float | None:
    """An option's value, else its ini setting's; a bad ini value is a usage error."""
    value = config.getoption(option)
    if value is not None:
        return kind(value)
    text = str(config.getini(ini)).strip()
    if not text:
        return None
    try:
        return kind(text)
    except ValueError:
        raise pytest.UsageError(f"ini setting {ini} = {text!r} is not a number") from None


def _app(config: pytest.Config) -> str | None:
    value = config.getoption("loopd_chaos") or config.getini("loopd_chaos")
    return str(value) if value else None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """A chaos item that would start after the budget is spent is not run and reports
    nothing (a budget ends the run; it adds no skipped item to the report); it is counted
    and the count is printed at the end."""
    del nextitem
    if not isinstance(item, ChaosItem) or item.budget is None:
        return None
    if time.monotonic() - item.config.stash[_STARTED] < item.budget:
        return None
    item.config.stash[_UNREACHED] = item.config.stash.get(_UNREACHED, 0) + 1
    workeroutput = getattr(item.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller adds the counts up
        workeroutput[_UNREACHED_KEY] = item.config.stash[_UNREACHED]
    return True


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """xdist: a worker's count of items left unrun by the budget, added to the run's."""
    del error
    config = getattr(node, "config", None)
    output = getattr(node, "workeroutput", None) or {}
    if config is not None and output.get(_UNREACHED_KEY):
        config.stash[_UNREACHED] = config.stash.get(_UNREACHED, 0) + int(output[_UNREACHED_KEY])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    left = terminalreporter.config.stash.get(_UNREACHED, 0)
    if left:
        budget = _number(terminalreporter.config, "loopd_chaos_budget", "loopd_chaos_budget",
                         float)  # fmt: skip
        terminalreporter.write_line(
            f"loopd chaos: {left} sampled cases not reached within the budget of "
            f"{budget or 0:g} s (not run, not reported)"
        )


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect items
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    app = _app(config)
    if app is None:
        return
    collector = ChaosCollector.from_parent(session, name=f"loopd-chaos[{app}]", app=app)
    items.extend(collector.collect())


class ChaosCollector(pytest.Collector):
    """Every case of the request scenarios through ``app``, enumerated by clean runs."""

    def __init__(self, *, app: str, **kwargs: object) -> None:
        super().__init__(nodeid=str(kwargs["name"]), **kwargs)  # type: ignore[arg-type]
        self.app = app

    def collect(self) -> list[pytest.Item]:
        from chaos.cases import ThenPower  # noqa: PLC0415 - the rig only when asked for
        from chaos.faults.hook import FaultKind  # noqa: PLC0415
        from chaos.scenarios.scenarios import SCENARIOS  # noqa: PLC0415
        from chaos.sweep.sampling import plan_sample  # noqa: PLC0415
        from chaos.sweep.sweep import ALL_FAULTS, build_cases  # noqa: PLC0415

        config = self.config
        chosen = config.getoption("loopd_chaos_faults")
        try:
            faults = [FaultKind(f.strip()) for f in chosen.split(",")] if chosen else ALL_FAULTS
        except ValueError as exc:
            known = ",".join(k.value for k in ALL_FAULTS)
            raise pytest.UsageError(f"--loopd-chaos-faults: {exc}; known: {known}") from None
        compound = bool(config.getoption("loopd_chaos_compound"))
        scenarios = [n for n in sorted(SCENARIOS) if SCENARIOS[n].hosts_apps]
        sample = _number(config, "loopd_chaos_sample", "loopd_chaos_sample", int)
        budget = _number(config, "loopd_chaos_budget", "loopd_chaos_budget", float)
        if sample is not None or budget is not None:
            seed = config.getoption("loopd_chaos_seed") or 0
            plan = plan_sample(scenarios, list(faults), _workdir(config), seed=seed,
                               compound=compound, app=self.app)  # fmt: skip
            picks = plan.first(int(sample)) if sample is not None else plan.picks
            return [
                ChaosItem.from_parent(self, name=_pick_name(n, p), pick=p, budget=budget)
                for n, p in enumerate(picks)
            ]
        then_power = None if compound else ThenPower.NONE
        cases = build_cases(scenarios, list(faults), _workdir(config), app=self.app,
                            compound=compound, then_power=then_power)  # fmt: skip
        return [ChaosItem.from_parent(self, name=c.id, case=c) for c in cases]


def _pick_name(index: int, pick: Pick) -> str:
    """A sampled item's name: its single case's id, or its compound stratum's."""
    if pick.case is not None:
        return pick.case.id
    return f"sample-{index}:" + ":".join(pick.stratum)


class ChaosViolation(Exception):
    """A case broke an invariant; carries its result."""

    def __init__(self, result: CaseResult) -> None:
        super().__init__(result)
        self.result = result


class ChaosItem(pytest.Item):
    """One case: a real worker hosting the App, faulted at one boundary, resumed, checked."""

    def __init__(
        self,
        *,
        case: Case | None = None,
        pick: Pick | None = None,
        budget: float | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.pick = pick
        self.case = case if case is not None else (pick.case if pick is not None else None)
        self.app = self.case.app if self.case is not None else _app(self.config)
        self.budget = budget
        self.add_marker(MARKER)
        if self.case is not None:
            self.user_properties.append(("replay", self.case.replay_line))

    def runtest(self) -> None:
        from chaos.run.crash_states import StateCache  # noqa: PLC0415
        from chaos.run.runner import run_case  # noqa: PLC0415

        config = self.config
        workdir = _workdir(config)
        if self.case is None and self.pick is not None:
            self.case = self.pick.expand(workdir)
            if self.case is None:
                pytest.skip(f"stratum {':'.join(self.pick.stratum)} has no case")
            self.user_properties.append(("replay", self.case.replay_line))
        assert self.case is not None
        if _CACHE not in config.stash:
            config.stash[_CACHE] = StateCache(_states_dir(config))
        result = run_case(self.case, workdir, states=config.stash[_CACHE])
        if result.outcome != "ok":
            raise ChaosViolation(result)

    def repr_failure(
        self,
        excinfo: pytest.ExceptionInfo[BaseException],
        style: str | None = None,
    ) -> str:
        if not isinstance(excinfo.value, ChaosViolation):
            return str(super().repr_failure(excinfo))
        result = excinfo.value.result
        lines = [f"{result.case} ({result.boundary}) through {self.app}:"]
        lines += [f"  {v}" for v in result.violations]
        lines += [f"  note: {n}" for n in result.notes]
        lines.append(f"replay: {result.replay_line}")
        return "\n".join(lines)

    def reportinfo(self) -> tuple[str, int | None, str]:
        return f"loopd-chaos[{self.app}]", None, self.case.id if self.case else self.name


_WORKDIR: Final = "_loopd_chaos_workdir"
_STARTED: pytest.StashKey[float] = pytest.StashKey()
_CACHE: pytest.StashKey[StateCache] = pytest.StashKey()
_UNREACHED: pytest.StashKey[int] = pytest.StashKey()
_UNREACHED_KEY: Final = "loopd_chaos_unreached"


def _workdir(config: pytest.Config) -> str:
    """This process's scratch directory for case homes (tmpfs when there is one)."""
    path = getattr(config, _WORKDIR, None)
    if path is None:
        from chaos.sweep.parallel import SHM  # noqa: PLC0415

        base = SHM if os.path.isdir(SHM) and os.access(SHM, os.W_OK) else None
        path = tempfile.mkdtemp(prefix="loopd-chaos-", dir=base)
        setattr(config, _WORKDIR, path)
    return str(path)


def pytest_unconfigure(config: pytest.Config) -> None:
    path = getattr(config, _WORKDIR, None)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
