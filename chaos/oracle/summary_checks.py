"""The scan summary a case leaves must say what a scan of the bytes it covers reads.

Open takes a summary (``<home>/scans/<id>.scan``; in PostgreSQL, the session's
``loopd.scan`` row; docs/format.md "The scan summary") for the bytes it covers without
scanning them again, so a summary that says otherwise of them (an open or a writer
that kept a wrong list, an App that wrote one) would make open accept or refuse what a
whole scan would not. ``scan-summary-true``: a summary that covers the
newest log holds exactly the classes, calls, Users and keys that a scan of those bytes
reads.
"""

from __future__ import annotations

from chaos.cases import CaseResult
from worker.store.format.line_scan import scan_lines
from worker.store.format.scan_summary import ScanSummary

INVARIANT = "scan-summary-true"


def final(
    result: CaseResult, summary: ScanSummary | None, where: str, newest: int, data: bytes
) -> None:
    """Check the session's ``summary`` (kept at ``where``) against ``data``, the newest log
    (epoch ``newest``)."""
    result.checked.append(INVARIANT)
    if summary is None or not summary.covers(data, newest):
        return  # none, or not of these bytes: open scans them whole
    said = summary.read()
    scan = scan_lines(data[: summary.size])
    if said is None or scan is None:
        result.violate(INVARIANT, f"{where} covers the log's first {summary.size} bytes "
                       "but does not say what they hold")  # fmt: skip
        return
    for name in ("types", "calls", "users", "keys"):
        if getattr(said, name) != getattr(scan, name):
            result.violate(
                INVARIANT,
                f"{where}: the {name} of the first {summary.size} bytes of epoch {newest} "
                "are not what a scan of them reads",
            )
            return
