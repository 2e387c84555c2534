"""The App an epoch is served by: its SessionStart's ``app`` block, then its AppChanged.

Checked wherever an epoch is (open, ``loopd verify``, the sealed reader): a SessionStart
names a non-empty ``module:attribute`` and version or no App at all, and each
``AppChanged`` follows on from the version before it (docs/format.md, "Apps").
"""

from __future__ import annotations

from collections.abc import Sequence

from worker.store.errors import InvalidLog, quote
from worker.store.format.records import AppChanged, Record, SessionStart
from worker.store.format.records_view import typed


def check_apps(path: str, records: Sequence[Record], types: list[type[Record]]) -> None:
    """InvalidLog at the first App record of an epoch that does not follow on."""
    first = records[0]
    assert isinstance(first, SessionStart)  # check_epoch has made sure
    if first.app is not None and (":" not in first.app or not first.app_version):
        raise InvalidLog(
            path,
            1,
            f"SessionStart.app {quote(first.app)} at {quote(first.app_version)}: an App is "
            "a module:attribute with a non-empty version",
        )
    if AppChanged not in types:
        return
    version = first.app_version
    epoch = typed(records)
    if epoch is not None:
        changes = epoch.of_type(AppChanged)
    else:
        changes = [(n, r) for n, r in enumerate(records, 1) if isinstance(r, AppChanged)]
    for number, record in changes:
        assert isinstance(record, AppChanged)
        if record.app != first.app or record.from_version != version:
            raise InvalidLog(
                path,
                number,
                f"AppChanged from {quote(record.app)} at {quote(record.from_version)}, but the "
                f"epoch was served by {quote(first.app)} at {quote(version)}",
            )
        if not record.to_version or record.to_version == record.from_version:
            raise InvalidLog(
                path, number, f"AppChanged to {quote(record.to_version)}: not another version"
            )
        version = record.to_version


def serving_app(records: Sequence[Record]) -> tuple[str, str] | None:
    """The App and version the epoch of ``records`` is served by as of its last record:
    its SessionStart's, or the newest AppChanged's; None when its SessionStart names none."""
    first = records[0] if records else None
    if not isinstance(first, SessionStart) or first.app is None or first.app_version is None:
        return None
    epoch = typed(records)
    if epoch is not None:
        change = epoch.last_of_type(AppChanged)
    else:
        change = next((r for r in reversed(records) if isinstance(r, AppChanged)), None)
    if isinstance(change, AppChanged):
        return first.app, change.to_version
    return first.app, first.app_version
