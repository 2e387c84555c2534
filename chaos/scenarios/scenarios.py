"""The rig's scenarios: deterministic sequences of operations a client asks of a worker.

Every operation is idempotent when retried the way a client retries: appends carry a
request key and are skipped when the key is already in the log; an epoch commit names
the epoch it leads to and is skipped once the session is there. So after any crash the
rig can resume by running the whole scenario again in a fresh worker.
"""

from __future__ import annotations

import os
from typing import Final

from chaos.scenarios.operator_tools import TOOL_KINDS, apply_tool_op
from chaos.scenarios.salvage_tool import prepare_damaged
from chaos.scenarios.scenario_types import (
    RETRY_SUMMARY,
    SESSION,
    SLOT,
    Op,
    Scenario,
    baseline_for,
)
from chaos.scenarios.schedule_ops import SCHEDULE_KINDS, SCHEDULES, apply_schedule_op
from worker.store.backend import SessionStore
from worker.store.disk import durable
from worker.store.format.records import (
    Assistant,
    EpochEnd,
    SessionStart,
    ToolResult,
    Usage,
    User,
    decode_record,
    encode_appended,
    encode_record,
    without_checksums,
)
from worker.store.session import Session

__all__ = [  # the scenario types are re-exported: the rig imports them from here
    "RETRY_SUMMARY",
    "SCENARIOS",
    "SESSION",
    "SLOT",
    "Op",
    "Scenario",
    "apply_op",
    "baseline_for",
]


def _prepare_interrupted(home: str) -> None:
    """A session whose log ends with EpochEnd and whose next epoch was never written."""
    with Session.create(home, SESSION, baseline_for(""), SLOT) as session:
        apply_op(session, home, Op("group", key="pre-1"), retry=False)
        apply_op(session, home, Op("group", key="pre-2"), retry=False)
        path = session.log_path
    with open(path, "rb") as f:
        written = f.read()
    fd = durable.open_append(path)
    try:
        end = EpochEnd(next=1, summary="summary recorded before the crash")
        os.write(fd, encode_appended(written, end))
        os.fsync(fd)
    finally:
        os.close(fd)


def _prepare_legacy(home: str) -> None:
    """A session of two epochs written before SessionStart carried the older epochs' state.

    Open reads such a session whole; its next commit writes the new form. The resumed
    worker must read it right, and the commit must carry forward what it read.
    """
    with Session.create(home, SESSION, baseline_for(""), SLOT) as session:
        apply_op(session, home, Op("group", key="old-1"), retry=False)
        apply_op(session, home, Op("commit", epoch=1, summary="legacy summary"), retry=False)
        apply_op(session, home, Op("group", key="old-2"), retry=False)
        path = session.log_path
    with open(path, "rb") as f:
        first, rest = f.read().split(b"\n", 1)
    start = decode_record(first)
    assert isinstance(start, SessionStart)
    legacy = SessionStart(
        time=start.time, session=start.session, epoch=start.epoch, slot=start.slot,
        baseline=start.baseline,
    )  # fmt: skip
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        # Before carried state there were no checksums either.
        os.write(fd, without_checksums(encode_record(legacy) + rest))
        os.fsync(fd)
    finally:
        os.close(fd)


SCENARIOS: Final = {
    s.name: s
    for s in (
        Scenario(
            name="basic",
            doc="create, appends, group commits, an epoch commit, more appends, a second commit",
            ops=(
                Op("create"),
                Op("append", key="k1"),
                Op("group", key="k2"),
                Op("group", key="k3"),
                Op("commit", epoch=1, summary="first summary"),
                Op("append", key="k4"),
                Op("group", key="k5"),
                Op("commit", epoch=2, summary="second summary"),
            ),
            extra_faults=("hostile",),
        ),
        Scenario(
            name="resume",
            doc="a session that starts with EpochEnd last (interrupted change) and resumes",
            prepare=_prepare_interrupted,
            ops=(
                Op("open"),
                Op("commit", epoch=1, summary="an argument resume must ignore"),
                Op("group", key="r1"),
                Op("commit", epoch=2, summary="after resume"),
                Op("append", key="r2"),
            ),
        ),
        Scenario(
            name="legacy",
            doc="a session written before SessionStart carried state: read whole, then "
            "moved to the new form by its next commit",
            prepare=_prepare_legacy,
            ops=(
                Op("open"),
                Op("group", key="l1"),
                Op("commit", epoch=2, summary="first carried"),
                Op("append", key="l2"),
                Op("commit", epoch=3, summary="second carried"),
                Op("group", key="l3"),
            ),
        ),
        Scenario(
            name="requests",
            doc="the default app's requests with keys, through the real worker loop, "
            "including its automatic epoch commit",
            ops=(),
            requests=tuple((f"q{n}", f"request number {n} " + "x" * 30) for n in range(6)),
            budget=50,
        ),
        Scenario(
            name="operator",
            doc="requests to an app whose summaries never repeat, and an operator's compact "
            "with its own summary, through the real worker loop",
            ops=(),
            requests=tuple((f"o{n}", f"operator scenario {n} " + "y" * 30) for n in range(5)),
            budget=50,
            app="chaos.scenarios.apps:UnrepeatableSummaryApp",
            compact=("o2", "the operator's own summary"),
        ),
        Scenario(
            name="operator-tools",
            doc="a session of four epochs; a backup of it live, more work, the backup "
            "restored into a scratch home, a key index file of the copy lost and rebuilt",
            ops=(
                Op("create"),
                *(
                    op
                    for n in (1, 2, 3)
                    for op in (Op("group", key=f"t{n}"), Op("commit", epoch=n, summary=f"t{n}"))
                ),
                Op("group", key="t4"),
                Op("backup"),  # of t1..t4
                Op("group", key="t5"),  # acknowledged after the backup's point
                Op("restore"),
                Op("group", key="t6"),
                Op("lose-index"),
                Op("rebuild-index"),
                Op("group", key="t7"),
            ),
            skip_faults=("damage",),
        ),
        Scenario(
            name="salvage",
            doc="a damaged session beside the worker's (a changed byte in its sealed "
            "epoch-1 log) salvaged with the real tool between two requests",
            ops=(Op("create"), Op("group", key="s1"), Op("salvage"), Op("group", key="s2")),
            prepare=prepare_damaged,
            skip_faults=("damage",),
        ),
        Scenario(
            name="streaming",
            doc="pipelined pairs of requests that ask for partials, to an app that streams "
            "each reply in three pieces before its group commit",
            ops=(),
            requests=tuple((f"s{n}", f"streamed request {n} " + "v" * 20) for n in range(4)),
            budget=4000,
            app="chaos.scenarios.stream_app:StreamingApp",
            batches=(("s0", "s1"), ("s2", "s3")),
            stream=True,
        ),
        Scenario(
            name="pipelined",
            doc="pipelined batches that carry a key twice, and a key applied in an earlier "
            "batch, with an epoch commit inside the second batch",
            ops=(),
            requests=tuple((f"p{n}", f"pipelined request {n} " + "u" * 30) for n in range(4)),
            budget=70,
            batches=(("p0", "p1", "p0"), ("p2", "p1", "p3", "p3")),
        ),
        Scenario(
            name="calls",
            doc="tool call numbers reserved before an epoch commit and written after it",
            ops=(
                Op("create"),
                Op("group", key="c1"),
                Op("reserve", name="t1"),
                Op("commit", epoch=1, summary="calls pending"),
                Op("reserve", name="t2"),
                Op("finish", key="t1", name="t1"),
                Op("finish", key="t2", name="t2"),
                Op("reserve", name="t3"),
                Op("commit", epoch=2, summary="one call pending"),
                Op("finish", key="t3", name="t3"),
            ),
        ),
        Scenario(
            name="retries",
            doc="requests over five epochs, then every key sent again through the real "
            "client from a fresh worker: keys of every epoch, and one never sent",
            ops=(),
            requests=tuple((f"e{n}", f"retried request {n} " + "z" * 40) for n in range(8)),
            budget=40,
            probes=("retry",),
        ),
        Scenario(
            name="cluster",
            doc="requests to a cluster node's worker: a lease file, an Owner token that "
            "grows at every start, then a Handoff, a stale owner and the new one",
            ops=(),
            requests=tuple((f"n{n}", f"cluster request {n} " + "w" * 30) for n in range(4)),
            budget=50,
            probes=("cluster",),
            extra_faults=("lease",),
        ),
        Scenario(
            name="slow",
            doc="slow turns under a request deadline: one burst of pipelined requests "
            "handed to the App in chunks, a tool loop twice the deadline long that reports "
            "progress; then the poison probe",
            ops=(),
            requests=(
                ("w0", "loop of tools that reports progress"),
                *((f"w{n}", f"slow turn {n} " + "t" * 20) for n in range(1, 7)),
            ),
            budget=60,
            app="chaos.scenarios.slow_app:slow_turns_app",
            probes=("poison",),
            worker_args=("--request-deadline", "0.1", "--hang-timeout", "1", "--max-batch", "8"),
            burst=True,
        ),
        Scenario(
            name="versions",
            doc="requests through the real worker loop to an App whose every resuming "
            "worker runs its next version: AppChanged mid-epoch, the new epochs its own",
            ops=(),
            requests=tuple((f"v{n}", f"versioned request {n} " + "r" * 30) for n in range(6)),
            budget=50,
            app="chaos.scenarios.versioned_app:VersionedApp",
            versions=("1", "2"),
        ),
        SCHEDULES,
    )
}


def apply_op(
    session: Session | None, home: str | SessionStore[Session], op: Op, *, retry: bool
) -> Session:
    """Run one operation (idempotently when ``retry``); return the session.

    ``home`` is a directory, or another store (the PostgreSQL seam's cases, chaos.postgres)
    for the operations that do not reach outside the session (not the operator's tools).
    """
    if op.kind == "create":
        if session is not None:
            return session
        if retry:
            return Session.open_or_create(home, SESSION, baseline_for(""), SLOT)
        return Session.create(home, SESSION, baseline_for(""), SLOT)
    if op.kind == "open":
        return session or Session.open(home, SESSION)
    assert session is not None
    if op.kind in ("reserve", "finish"):
        return _tool_call(session, op)
    if op.kind in SCHEDULE_KINDS:
        return apply_schedule_op(session, op)
    if op.kind in TOOL_KINDS:
        assert isinstance(home, str), "the operator's tools run on a home directory"
        return apply_tool_op(session, home, op.kind, SESSION)
    if op.kind in ("append", "group"):
        if session.find_key(op.key) is not None:
            return session  # applied before the crash: the log answers the retry
        user = User(text=f"text of {op.key}", key=op.key)
        if op.kind == "append":
            session.append(user)
        else:
            session.append_many(
                [
                    user,
                    ToolResult(call=session.next_call(), tool="echo", output=user.text, ok=True),
                    Assistant(text=f"echo: {user.text}"),
                    Usage(prompt_tokens=5, completion_tokens=7, context_tokens=12),
                ]
            )
        return session
    if op.kind == "commit":
        if session.epoch >= op.epoch:
            return session
        last = session.records[-1]
        summary = RETRY_SUMMARY if retry else op.summary
        used = last.summary if isinstance(last, EpochEnd) else summary
        session.commit_epoch(summary, baseline_for(used))
        return session
    raise ValueError(f"unknown op {op.kind!r}")


_RESERVED: dict[str, int] = {}  # a child's tool calls in progress: name -> call number


def _tool_call(session: Session, op: Op) -> Session:
    """``reserve``: a tool call starts and takes its number; ``finish``: its result is
    written (a keyed request of four records) with that number, maybe epochs later. A
    reservation dies with its process: after a restart the call starts again."""
    if session.find_key(op.key or op.name) is not None:
        return session  # finished before the crash
    if op.kind == "reserve":
        _RESERVED.setdefault(op.name, session.next_call())
        return session
    call = _RESERVED.pop(op.name, None) or session.next_call()
    user = User(text=f"text of {op.key}", key=op.key)
    session.append_many(
        [
            user,
            ToolResult(call=call, tool="echo", output=user.text, ok=True),
            Assistant(text=f"echo: {user.text}"),
            Usage(prompt_tokens=5, completion_tokens=7, context_tokens=12),
        ]
    )
    return session
