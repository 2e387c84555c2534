"""A scan summary kept by the writer as its log grows, not only made by an open.

An open keeps a summary of what it scanned (``worker.store.format.scan_summary``), so
the next open scans only the lines written after it. A worker that then appends for
hours leaves all those lines to its successor's scan: a session's restart or failover
would scan megabytes. So the writer keeps the summary going: it holds the summary of
its log's first bytes (the open's, or one it made) and the bytes it appended after
them, and once those are worth it, it scans them alone (``summary_after``) and puts
the longer summary where the next open finds it. The next open then scans at most
about ``due``'s bytes.

What a kept summary says is what a scan of the bytes reads: the same scan, of the
appended lines, joined to the summary of those before. An open takes it only for the
bytes it covers (``ScanSummary.covers``), as any summary.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.store.format import scan_summary
from worker.store.format.dataclass_methods import MutableValue
from worker.store.format.line_scan import LineScan, summary_after
from worker.store.format.scan_summary import ScanSummary


@dataclass(slots=True, repr=False, eq=False)
class KeptScan(MutableValue):
    """The newest log as a summary of its first bytes (``base``, None: none yet) and the
    bytes appended after them (``tail``, whole lines)."""

    epoch: int
    base: ScanSummary | None
    tail: bytearray

    def add(self, data: bytes) -> None:
        """Lines appended to the log, durable."""
        self.tail += data

    def due(self) -> bool:
        """Whether the appended bytes are worth a new summary: at least ``SUMMARY_AFTER``
        and twice the summary's own size (what is written for them then stays under half
        of what the log grew by); every group when ``SUMMARY_AFTER`` is 0 (the chaos rig)."""
        after = scan_summary.SUMMARY_AFTER
        if not after:
            return bool(self.tail)
        weight = 0 if self.base is None else self.base.weight
        return len(self.tail) >= max(after, 2 * weight)

    def take(self) -> ScanSummary | None:
        """The summary of the whole log now, which becomes the base; None if the appended
        lines cannot be summarized (then nothing more is kept for this log)."""
        summary = summary_after(self.base, bytes(self.tail), self.epoch)
        if summary is not None:
            self.base = summary
            self.tail.clear()
        return summary


def kept_after_open(
    scan: LineScan, known: ScanSummary | None, epoch: int, data: bytes
) -> tuple[ScanSummary | None, KeptScan | None]:
    """After open's ``scan`` of ``data`` (epoch ``epoch``'s log, its first bytes taken from
    ``known`` when the scan did not read them): the summary to keep now, if the scan read
    enough to be worth one, and the log as its writer goes on from it."""
    if scan.scanned >= scan_summary.SUMMARY_AFTER:
        summary = scan.summary(epoch, data)
        if summary is not None:
            return summary, KeptScan(epoch, summary, bytearray())
        return None, None  # a call number past 8 bytes: no summary of this log
    start = len(data) - scan.scanned  # > 0: the lines before it were ``known``'s
    return None, KeptScan(epoch, known if start else None, bytearray(data[start:]))
