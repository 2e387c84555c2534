"""The rig's scenario types: an operation a client asks of the store, and a scenario.

Kept apart from the scenarios themselves (``chaos.scenarios.scenarios``) so that the modules that
define the operations of a feature (``chaos.scenarios.schedule_ops``) use them too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from worker.store.baseline import Baseline

SESSION: Final = "chaos"
SLOT: Final = 7
RETRY_SUMMARY: Final = "summary given on retry"
# The records one keyed request appends: a group commit of four, or a single User.
GROUP_SHAPE: Final = ("User", "ToolResult", "Assistant", "Usage")
SINGLE_SHAPE: Final = ("User",)
VERSION_ENV: Final = "LOOPD_CHAOS_APP_VERSION"
"""A worker's App version in the ``versions`` scenario (chaos.scenarios.versioned_app)."""


def baseline_for(memory: str) -> Baseline:
    """The deterministic baseline of an epoch whose carried memory is ``memory``."""
    return Baseline(system="chaos scenario", memory=memory, tools=[{"name": "echo"}])


@dataclass(frozen=True, slots=True)
class Op:
    """One client operation: create, append (one record), group (four), commit, open."""

    kind: str
    key: str = ""
    epoch: int = 0
    summary: str = ""
    name: str = ""  # reserve/finish: the tool call whose number is reserved (not a key)
    at: str = ""  # schedule: when its Schedule is due (the records' time format)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named scenario: how its pre-state is built and what the client asks, in order."""

    name: str
    ops: tuple[Op, ...]
    doc: str
    prepare: Callable[[str], None] | None = None
    requests: tuple[tuple[str, str], ...] = ()  # (key, text) for the worker-level scenario
    budget: int = 0
    app: str | None = None  # the worker's app (module:attribute), else the default app
    compact: tuple[str, str] | None = None  # (after which key, the operator's summary)
    contract: bool = False  # the app is a user's: its workers are checked against the contract
    # A user's App: the record types each request key appends, learned from a clean run.
    shapes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # The checks run once the resume finished (chaos.run.probes): "retry" sends every key
    # again through the real client; "cluster" runs workers as a cluster node's.
    probes: tuple[str, ...] = ()
    extra_faults: tuple[str, ...] = ()  # the fault kinds beyond the five that apply here
    # The fault kinds of the five it does not take: ``damage`` finds the session from
    # the path of the step, and an operator tool's steps are outside its directory.
    skip_faults: tuple[str, ...] = ()
    # Pipelined batches of request keys (a key may be in one twice), each sent in one
    # write on a connection of the client's own (chaos.run.batch_client); ``stream`` asks
    # for partials.
    batches: tuple[tuple[str, ...], ...] = ()
    stream: bool = False
    worker_args: tuple[str, ...] = ()  # more flags of its worker (a deadline, chunk sizes)
    burst: bool = False  # every request sent in one write, then again (chaos.run.slow_client)
    # The App's version in the first worker, then in every worker that resumes the case
    # (chaos.scenarios.versioned_app, chaos.oracle.version_checks); None: one version throughout.
    versions: tuple[str, str] | None = None

    @property
    def worker_level(self) -> bool:
        return bool(self.requests)

    @property
    def hosts_apps(self) -> bool:
        """Whether a user's App can run in it (the probes' scenarios run the rig's app)."""
        return self.worker_level and not self.probes and not self.batches and not self.versions

    def shape(self, key: str) -> tuple[str, ...]:
        """The record types the request ``key`` appends, User first, in one group."""
        for known, shape in self.shapes:
            if known == key:
                return shape
        for op in self.ops:
            if op.key == key and op.kind == "append":
                return SINGLE_SHAPE
        return GROUP_SHAPE  # groups, the default app's requests, and prepared keys
