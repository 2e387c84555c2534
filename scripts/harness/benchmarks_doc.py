"""The one writer of docs/benchmarks.md: a benchmark's section replaced in place, or appended.

Each section is the block between ``<!-- TAG:start -->`` and ``<!-- TAG:end -->``, the
two markers included; a benchmark's ``--write-docs`` hands its whole block to
``write_section``, so that running it again rewrites that block and nothing around it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[2]
BENCHMARKS_MD: Final = REPO / "docs" / "benchmarks.md"


def write_section(tag: str, section: str, doc: Path = BENCHMARKS_MD) -> None:
    """Replace the ``<!-- tag:start -->`` ... ``<!-- tag:end -->`` block of ``doc``, or append it.

    ``section`` must begin with the start marker and end with the end marker, so that
    the next run finds the block it wrote.
    """
    start, end = f"<!-- {tag}:start -->", f"<!-- {tag}:end -->"
    if not (section.startswith(start) and section.endswith(end)):
        raise ValueError(f"a {tag!r} section must begin with {start} and end with {end}")
    text = doc.read_text(encoding="utf-8") if doc.exists() else "# Benchmarks\n"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _old, tail = rest.split(end, 1)
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    doc.write_text(text, encoding="utf-8")
