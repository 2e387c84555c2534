"""pytest plugin (entry point ``pytest11``): the chaos cases of a user's App as test items.

``pytest --loopd-chaos=module:attribute`` (or ``loopd_chaos = module:attribute`` in the
ini file) adds one item per case of the request scenarios run through that App, so
``pytest -n auto`` shards them, ``-k`` selects them and ``--junitxml`` reports them. A
failing item shows its violations and the one line that replays it. Without the option
the plugin adds nothing and imports nothing of the rig.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Final

import pytest

if TYPE_CHECKING:
    from chaos.cases import Case, CaseResult

ALL_FAULTS: Final = "kill,torn,power,io,short"
MARKER: Final = "loopd_chaos"


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
        default=ALL_FAULTS,
        help=f"comma-separated fault kinds of those cases (default: {ALL_FAULTS}).",
    )
    group.addoption(
        "--loopd-chaos-compound",
        action="store_true",
        help="also the compound cases (a crash of the recovery, a power loss after a resume).",
    )
    parser.addini("loopd_chaos", "the App (module:attribute) of --loopd-chaos", default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: a case of the loopd crash rig (--loopd-chaos)")


def _app(config: pytest.Config) -> str | None:
    value = config.getoption("loopd_chaos") or config.getini("loopd_chaos")
    return str(value) if value else None


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
        from chaos.hook import FaultKind  # noqa: PLC0415
        from chaos.scenarios import SCENARIOS  # noqa: PLC0415
        from chaos.sweep import build_cases  # noqa: PLC0415

        config = self.config
        faults = [FaultKind(f.strip()) for f in config.getoption("loopd_chaos_faults").split(",")]
        compound = bool(config.getoption("loopd_chaos_compound"))
        scenarios = [n for n in sorted(SCENARIOS) if SCENARIOS[n].hosts_apps]
        then_power = None if compound else ThenPower.NONE
        cases = build_cases(scenarios, faults, _workdir(config), app=self.app,
                            compound=compound, then_power=then_power)  # fmt: skip
        return [ChaosItem.from_parent(self, name=c.id, case=c) for c in cases]


class ChaosViolation(Exception):
    """A case broke an invariant; carries its result."""

    def __init__(self, result: CaseResult) -> None:
        super().__init__(result)
        self.result = result


class ChaosItem(pytest.Item):
    """One case: a real worker hosting the App, faulted at one boundary, resumed, checked."""

    def __init__(self, *, case: Case, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.case = case
        self.add_marker(MARKER)
        self.user_properties.append(("replay", case.replay_line))

    def runtest(self) -> None:
        from chaos.runner import run_case  # noqa: PLC0415

        result = run_case(self.case, _workdir(self.config))
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
        lines = [f"{result.case} ({result.boundary}) through {self.case.app}:"]
        lines += [f"  {v}" for v in result.violations]
        lines += [f"  note: {n}" for n in result.notes]
        lines.append(f"replay: {result.replay_line}")
        return "\n".join(lines)

    def reportinfo(self) -> tuple[str, int | None, str]:
        return f"loopd-chaos[{self.case.app}]", None, self.case.id


_WORKDIR: Final = "_loopd_chaos_workdir"


def _workdir(config: pytest.Config) -> str:
    """This process's scratch directory for case homes (tmpfs when there is one)."""
    path = getattr(config, _WORKDIR, None)
    if path is None:
        from chaos.parallel import SHM  # noqa: PLC0415

        base = SHM if os.path.isdir(SHM) and os.access(SHM, os.W_OK) else None
        path = tempfile.mkdtemp(prefix="loopd-chaos-", dir=base)
        setattr(config, _WORKDIR, path)
    return str(path)


def pytest_unconfigure(config: pytest.Config) -> None:
    path = getattr(config, _WORKDIR, None)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
