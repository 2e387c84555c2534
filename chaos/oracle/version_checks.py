"""The invariant of App versions (the ``versions`` scenario), read from the files.

``resumed-under-new-version``: the case's first worker runs the App at the scenario's
first version, every worker that resumes it at the second (``chaos.scenarios.versioned_app``).
Once the scenario is finished:

- every epoch's ``SessionStart`` names the App at one of the two versions, and its
  baseline was built by that version (``next_baseline`` is deterministic per version);
- every epoch the files did not hold right after the fault names the new version: an
  epoch is begun, and its ``SessionStart`` written, by the worker that commits it;
- the newest epoch the fault left open (no ``EpochEnd``) and begun by the old version
  says, in one ``AppChanged`` from the old version to the new, that the new one served
  it from then on; no other epoch holds one but those the files already held after the
  fault (a resumed worker's, before a power loss under it).

Old keys still answered from the log under the new version are judged by
``no-key-twice`` and ``acknowledged-on-disk``.
"""

from __future__ import annotations

import json
from typing import Final

from chaos.cases import CaseResult
from chaos.scenarios.scenario_types import Scenario
from chaos.scenarios.versioned_app import system_of

RESUMED: Final = "resumed-under-new-version"


def drives_versions(scenario: Scenario) -> bool:
    return scenario.versions is not None


def final(
    result: CaseResult,
    scenario: Scenario,
    after_fault: dict[int, list[dict[str, object]]],
    epochs: dict[int, list[dict[str, object]]],
    baselines: dict[int, bytes],
) -> None:
    """Each epoch named by the version that began it; the open one's change recorded."""
    assert scenario.versions is not None
    assert scenario.app is not None
    result.checked.append(RESUMED)
    old, new = scenario.versions
    left = max(after_fault, default=-1)
    open_start = _open_epoch_start(after_fault, left, old)
    for epoch, records in sorted(epochs.items()):
        start = records[0] if records else {}
        named = (start.get("app"), start.get("app_version"))
        if named not in ((scenario.app, old), (scenario.app, new)):
            result.violate(RESUMED, f"epoch {epoch}'s SessionStart names {named}")
            continue
        if epoch > left and named[1] != new:
            result.violate(
                RESUMED,
                f"epoch {epoch}, begun after the fault by a worker of version {new}, names "
                f"version {named[1]}",
            )
        system = _system(baselines.get(epoch))
        if system is not None and system != system_of(str(named[1])):
            result.violate(
                RESUMED, f"epoch {epoch} names version {named[1]} but its baseline is {system!r}"
            )
        changes = _changes(records, start)
        wanted = _changes(after_fault.get(epoch), start)
        if epoch == left and start == open_start and not wanted:
            wanted = [(old, new)]
        if changes != wanted:
            result.violate(
                RESUMED,
                f"epoch {epoch} holds AppChanged {changes}, not {wanted} (the fault left "
                f"epoch {left} {'open under ' + old if open_start else 'closed or newer'})",
            )


def _changes(records: list[dict[str, object]] | None, start: dict[str, object]) -> list[object]:
    """The (from, to) of each AppChanged of an epoch's ``records`` whose SessionStart is
    ``start`` (none if that epoch began otherwise: another file)."""
    if not records or records[0] != start:
        return []
    return [
        (r.get("from_version"), r.get("to_version"))
        for r in records
        if r.get("type") == "AppChanged"
    ]


def _open_epoch_start(
    after_fault: dict[int, list[dict[str, object]]], newest: int, old: str
) -> dict[str, object] | None:
    """The SessionStart of the newest epoch the fault left, if it is open (no EpochEnd
    last) and was begun by ``old``: the epoch the next worker resumes mid-way."""
    records = after_fault.get(newest) or []
    if not records or records[-1].get("type") == "EpochEnd":
        return None
    start = records[0]
    return (
        start if start.get("type") == "SessionStart" and start.get("app_version") == old else None
    )


def _system(data: bytes | None) -> str | None:
    """A baseline file's system prompt, or None if it is not there or not JSON."""
    if data is None:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value.get("system") if isinstance(value, dict) else None
