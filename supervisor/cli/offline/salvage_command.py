"""``loopd salvage``: keep the longest prefix open accepts, for damage repair refuses."""

from __future__ import annotations

import sys
from typing import Final

import click

from supervisor.cli.offline.offline_commands import EXIT_REFUSED, require_home
from supervisor.cli.options import existing_home_option
from worker.offline.salvage import salvage_session
from worker.store.errors import SessionError


@click.command()
@existing_home_option
@click.argument("session_id", metavar="ID")
def salvage(home: str, session_id: str) -> None:
    """Cut session ID back to the longest prefix that opens; quarantine the rest.

    For damage `loopd repair` refuses (a bad line mid-log, a sealed epoch). Loud: it
    prints every record and key it cut, and acknowledged work may be among them.
    Nothing is deleted: what is cut goes to <home>/quarantine/ID/. Refused while a
    worker holds the session, and for a session that opens. A salvage cut short (a
    kill, a power loss) is finished by running it again, which lists all it cut.
    """
    require_home("salvage", home)
    try:
        result = salvage_session(home, session_id)
    except SessionError as exc:
        click.echo(f"loopd salvage: refused: {exc}", err=True)
        sys.exit(EXIT_REFUSED)
    if result.resumed:
        click.echo(
            "finished an interrupted salvage from its plan: everything below is what it "
            "cut, the part the interrupted run had moved included"
        )
    click.echo(f"the session was refused: {result.refusal}")
    epochs = f"epochs 0-{result.kept_epoch}" if result.kept_epoch else "epoch 0"
    click.echo(
        f"kept: {epochs}, the last up to byte {result.kept_bytes} (the longest prefix that opens)"
    )
    keys: list[str] = []
    unreadable = 0
    for cut in result.cuts:
        unreadable += sum("undecodable" in record for record in cut.records)
        what = "the whole epoch" if cut.whole else "its lines after the prefix"
        click.echo(
            f"CUT epoch {cut.epoch}, {what}: lines {cut.first_line}-{cut.last_line} "
            f"({len(cut.records)} lines)"
        )
        for record in cut.records:
            click.echo(f"   {record}")
        keys.extend(cut.keys)
    click.echo(f"moved to {result.quarantine} (nothing was deleted)")
    unknown = f" (and those of {unreadable} undecodable lines, unknown)" if unreadable else ""
    click.echo(
        f"keys cut ({len(keys)}): {', '.join(keys) if keys else 'none'}{unknown}\n"
        "WARNING: acknowledged work may be among what was cut: unless the damage is a torn "
        "last group a crash left (which `loopd repair` cuts, and says so), these records "
        "may have been answered. A request sent again under a cut key is applied again. "
        f"Next: loopd start {session_id}"
    )


COMMANDS: Final = (salvage,)
