"""The demo's first part: the session store on its own."""

from __future__ import annotations

import os
import shutil

import click

from supervisor.demo.checks import DemoChecks
from worker.store.baseline import Baseline
from worker.store.errors import TornLog
from worker.store.format.records import Assistant, ToolResult, Usage, User
from worker.store.session import Session

DEMO_BASELINE = Baseline(
    system="You are the loopd demo assistant.",
    memory="",
    tools=[{"name": "echo", "description": "repeat the text"}],
)


def run_store_demo(home: str, checks: DemoChecks) -> None:
    """Create a session, append, commit an epoch, reopen, and refuse a torn copy."""
    click.echo(f"\n== the session store ({home})")
    with Session.create(home, "demo-store", DEMO_BASELINE, slot=3) as session:
        for n in range(3):
            session.append(User(text=f"hello {n}", key=f"req-{n}"))
            session.append_many(
                [
                    ToolResult(call=session.next_call(), tool="echo", output=f"hello {n}", ok=True),
                    Assistant(text=f"echo: hello {n}"),
                    Usage(prompt_tokens=10, completion_tokens=5, context_tokens=15 * (n + 1)),
                ]
            )
        session.commit_epoch("three greetings were echoed", DEMO_BASELINE)
        session.append(User(text="after the epoch change"))
        path = session.log_path
    with Session.open(home, "demo-store") as session:
        click.echo(f"  reopened: epoch {session.epoch}, carry {session.carry!r}")
        checks.check("reopen loads epoch 1", session.epoch == 1)
        checks.check("the carry is the summary", session.carry == "three greetings were echoed")
        checks.check("the slot survives the epoch change", session.slot == 3)
        checks.check("next_call continues at 4", session.next_call() == 4)
    # A copy in a second home: the original stays intact, the copy is torn.
    torn_home = os.path.join(home, "torn-copy")
    torn_dir = os.path.join(torn_home, "sessions", "demo-store")
    shutil.copytree(os.path.dirname(path), torn_dir)
    torn_log = os.path.join(torn_dir, "1.jsonl")
    with open(torn_log, "rb") as f:
        data = f.read()
    with open(torn_log, "wb") as f:
        f.write(data[:-7])  # cut the last line short, as a crash mid-write would
    before = open(torn_log, "rb").read()  # noqa: SIM115 - read whole, closed by refcount
    try:
        Session.open(torn_home, "demo-store")
    except TornLog as exc:
        click.echo(f"  a torn copy is refused: {exc}")
        checks.check("the torn log is refused at line 2", exc.line == 2)
    else:
        checks.check("the torn log is refused", False)
    with open(torn_log, "rb") as f:
        checks.check("the refused file is byte-identical", f.read() == before)
