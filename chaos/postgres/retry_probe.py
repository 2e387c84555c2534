"""After a seam case: every applied key answered from the log where the database keeps it.

A retry of a key is answered with the records its request wrote (``request_records``);
for a key of a sealed epoch they are read from that epoch's log. Here the case's
session is opened from the database as its next owner would and each key of the final
view is looked up and read back: the request's records, its ``User`` first, as the view
holds them (``retry-answered-from-log``, the file rig's probe of the same name). A
PostgreSQL session once read a sealed log from a directory named after its URI, which
does not exist: every such retry was answered with an error and no text.
"""

from __future__ import annotations

from chaos.cases import CaseResult
from chaos.oracle.oracle import LogsView
from chaos.run.child import in_child
from chaos.run.probes import RETRY, requests_by_key
from chaos.scenarios.scenarios import SESSION
from worker.store.errors import SessionError
from worker.store.postgres import PostgresStore
from worker.store.request_records import request_records
from worker.store.session import Session


def retry_probe(result: CaseResult, uri: str, final: LogsView, mutant: str | None) -> None:
    """Open the case's session from ``uri`` (the case is over) and read each key back, in
    a forked child with the case's mutant applied (as every store of a case runs)."""
    result.checked.append(RETRY)

    def probe() -> list[str]:
        found = CaseResult(case=result.case, fault=result.fault, boundary=result.boundary)
        _probe(found, uri, final)
        return found.violations

    violations = in_child(probe, mutant)
    if not isinstance(violations, list):
        result.violate(RETRY, "the probe's process failed")
        return
    for violation in violations:
        result.violate(RETRY, str(violation).removeprefix(f"{RETRY}: "))


def _probe(result: CaseResult, uri: str, final: LogsView) -> None:
    expected = requests_by_key(final)
    try:
        with Session.open(PostgresStore(uri), SESSION) as session:
            for key, (epoch, wrote) in expected.items():
                ref = session.find_key(key)
                if ref is None or ref.epoch != epoch:
                    result.violate(RETRY, f"{key!r}, applied in epoch {epoch}, is found at {ref}")
                    return
                read = request_records(session, ref)
                types = [type(r).__name__ for r in read]
                texts = [getattr(r, "text", None) for r in read]
                if types != [w.get("type") for w in wrote] or texts != [
                    w.get("text") for w in wrote
                ]:
                    result.violate(RETRY, f"{key!r} in epoch {epoch} is answered from "
                                   f"{types} {texts}; the log holds {wrote}")  # fmt: skip
                    return
    except SessionError as exc:
        result.violate(RETRY, f"a retry could not be answered from the log: {exc}")
