"""The App of the rig's ``versions`` scenario: one App whose version is set per worker.

Its version is the module's ``version`` (docs/apps.md, "Versions"), read from
``LOOPD_CHAOS_APP_VERSION`` when a worker asks, so that the rig runs the first worker of
a case under one version and every worker that resumes it under the next (the rig sets
the variable in each forked worker, ``chaos.run.worker_run``). Its baselines name the
version that built them: ``next_baseline`` is deterministic per version, and a resume
after an ``EpochEnd`` under the new version builds the next epoch with the new one.
"""

from __future__ import annotations

import os

from chaos.scenarios.scenario_types import VERSION_ENV
from worker.app import Baseline, DefaultApp, Session


def __getattr__(name: str) -> str:
    """The module's ``version``: the worker's, from its environment (default "1")."""
    if name == "version":
        return os.environ.get(VERSION_ENV, "1")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def system_of(version: str) -> str:
    """The system prompt of every baseline built by ``version``."""
    return f"versioned app {version}"


class VersionedApp(DefaultApp):
    """The default App, whose baselines say which version built them."""

    def initial_baseline(self, session_id: str) -> Baseline:
        return Baseline(system=system_of(__getattr__("version")), memory="", tools=[])

    def next_baseline(self, session: Session, summary: str) -> Baseline:
        return Baseline(system=system_of(__getattr__("version")), memory=summary, tools=[])
