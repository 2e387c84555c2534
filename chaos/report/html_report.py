"""The HTML report of a run: one self-contained page, boundaries x faults.

Each row is a boundary of a scenario (``k``: its step and file), each column a fault
and variant; a cell holds every case whose first fault is that one at that boundary
(the compound ones too), is green when all held, red when one broke an invariant, and
links to its cases below: each with its replay line and its violations.
"""

from __future__ import annotations

import html
from collections import defaultdict
from typing import TYPE_CHECKING, Final

from chaos.cases import Case, CaseResult

if TYPE_CHECKING:
    from chaos.report.violation_groups import Group

_STYLE: Final = """
body { font: 14px system-ui, sans-serif; margin: 1.5em; }
table { border-collapse: collapse; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: center; }
th.row { text-align: left; font-weight: normal; white-space: nowrap; }
td.ok { background: #c8f0c8; } td.bad { background: #f4a6a6; font-weight: bold; }
td a { color: inherit; text-decoration: none; display: block; }
li.bad { color: #900; } code { background: #f4f4f4; }
"""


def write_html_report(path: str, results: list[CaseResult], *, title: str) -> None:
    """Write the page for ``results`` to ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_html_report(results, title=title))


def render_html_report(
    results: list[CaseResult],
    *,
    title: str,
    groups: list[Group] | None = None,
    status: str = "finished",
) -> str:
    """The page for ``results`` (standard library only, no script, no external file):
    the violations' ``groups`` first (each with its count and one replay line), then the
    boundaries x faults table, then every case."""
    cells: dict[tuple[str, int], dict[str, list[CaseResult]]] = defaultdict(dict)
    boundaries: dict[tuple[str, int], str] = {}
    columns: set[str] = set()
    for result in results:
        case = Case.parse(result.case)
        column = f"{case.fault.value}:{case.variant}"
        row = (case.scenario, case.at)
        columns.add(column)
        boundaries.setdefault(row, result.boundary)
        cells[row].setdefault(column, []).append(result)
    order = sorted(columns)
    bad = sum(r.outcome != "ok" for r in results)
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{len(results)} cases, {bad} with a violation"
        f"{'' if status == 'finished' else f' (the run is {html.escape(status)})'}.</p>",
        *_groups_section(groups or []),
        "<table><tr><th>boundary</th>",
        *(f"<th>{html.escape(c)}</th>" for c in order),
        "</tr>",
    ]
    for row in sorted(cells):
        scenario, at = row
        label = f"{scenario} {at}: {boundaries[row]}"
        out.append(f"<tr><th class='row'>{html.escape(label)}</th>")
        for column in order:
            found = cells[row].get(column, [])
            if not found:
                out.append("<td></td>")
                continue
            broken = [r for r in found if r.outcome != "ok"]
            target = (broken or found)[0]
            text = f"{len(broken)}/{len(found)}" if broken else str(len(found))
            out.append(
                f"<td class='{'bad' if broken else 'ok'}'>"
                f"<a href='#{_anchor(target)}' title='{html.escape(target.case)}'>{text}</a></td>"
            )
        out.append("</tr>")
    out += ["</table>", "<h2>Cases</h2><ul>"]
    for result in sorted(results, key=lambda r: (r.outcome == "ok", r.case)):
        out.append(
            f"<li id='{_anchor(result)}' class='{'ok' if result.outcome == 'ok' else 'bad'}'>"
            f"{html.escape(result.case)} ({html.escape(result.boundary)}): {result.outcome}"
            f" &mdash; <code>{html.escape(result.replay_line)}</code>"
        )
        if result.violations:
            out.append("<ul>")
            out += [f"<li>{html.escape(v)}</li>" for v in result.violations]
            out.append("</ul>")
        out.append("</li>")
    out.append("</ul></body></html>\n")
    return "\n".join(out)


def _groups_section(groups: list[Group]) -> list[str]:
    """The violations by invariant and first cause, each with one case to replay."""
    if not groups:
        return []
    out = ["<h2>Violations by invariant and first cause</h2><ul>"]
    for group in groups:
        assert group.example is not None
        out.append(
            f"<li class='bad'><b>{html.escape(group.invariant)}</b> &times; {group.count}: "
            f"{html.escape(group.cause)} &mdash; e.g. <a href='#{_anchor(group.example)}'>"
            f"{html.escape(group.example.case)}</a>: "
            f"<code>{html.escape(group.example.replay_line)}</code></li>"
        )
    out.append("</ul>")
    return out


def _anchor(result: CaseResult) -> str:
    return "case-" + "".join(c if c.isalnum() else "_" for c in result.case)
