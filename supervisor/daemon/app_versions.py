"""Which sessions run an older App version than a worker started now would load.

The ``app_versions`` control operation: for each distinct App of the hosted sessions
(its ``module:attribute``, import path, working directory and environment, as its
worker would import it) one child interpreter imports the App and prints its version
by the worker's own rule (``worker.app.version``). The children run beside the loop
(asyncio subprocesses): the daemon never imports an App and never waits on one. Each
session's row compares its current epoch's ``SessionStart`` (``hosted_status.app_of``)
with its App's version now (docs/operations.md, "App versions").
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Final

from supervisor.hosting.apps import IMPORT_TIMEOUT
from supervisor.sessions.endpoints import Waiter
from supervisor.sessions.hosted import HostedSession
from supervisor.sessions.hosted_status import app_of
from supervisor.sessions.spawn import WorkerSpec
from worker.app import DEFAULT_APP
from worker.ipc.wire import Message, error, ok

_CHECK: Final = """
import json, sys
sys.path[:0] = json.loads(sys.argv[2])
from worker.app.version import app_version
print(json.dumps(app_version(sys.argv[1])))
"""
MAX_WHY: Final = 500
"""Characters of a failed check's last line of stderr kept in the reply."""

_running: set[asyncio.Task[None]] = set()

AppKey = tuple[str, tuple[str, ...], str | None, tuple[tuple[str, str], ...]]
"""An App as its worker imports it: target, import path, working directory, environment."""


def app_key(spec: WorkerSpec) -> AppKey:
    """What decides which code a session's worker would load."""
    return (spec.app or DEFAULT_APP, spec.path, spec.cwd, tuple(sorted(spec.extra_env.items())))


async def check_version(key: AppKey) -> tuple[str | None, str | None]:
    """``(version, None)`` of the App ``key`` names as a worker would import it now, or
    ``(None, why)`` if it does not import (or takes longer than the import check may)."""
    target, path, cwd, env = key
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _CHECK, target, json.dumps(list(path)),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=cwd, env={**os.environ, **dict(env)},
        )  # fmt: skip
    except OSError as exc:
        return None, f"cannot start the check: {exc}"
    try:
        out, err = await asyncio.wait_for(proc.communicate(), IMPORT_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return None, f"did not import within {IMPORT_TIMEOUT:g} s"
    if proc.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines() or ["no output"]
        return None, f"does not import: {lines[-1][:MAX_WHY]}"
    try:
        version = json.loads(out)
    except ValueError:
        version = None
    if not isinstance(version, str):
        return None, "the check printed no version"
    return version, None


def answer_app_versions(
    loop: asyncio.AbstractEventLoop,
    sessions: Mapping[str, HostedSession],
    named: Callable[[str], str | None],
    waiter: Waiter,
) -> None:
    """Reply to ``waiter``, once every App's check is done, with each session's App, its
    epoch's version, the version now, whether it is older, and how many are; ``named``
    gives a session's named App (None: serve's ``--app``)."""
    keys = {session_id: app_key(hosted.spec) for session_id, hosted in sorted(sessions.items())}
    epochs = {session_id: app_of(hosted) for session_id, hosted in sessions.items()}
    names = {session_id: named(session_id) for session_id in keys}

    async def answer() -> None:
        distinct = sorted(set(keys.values()))
        checked = dict(
            zip(distinct, await asyncio.gather(*map(check_version, distinct)), strict=True)
        )
        rows: list[Message] = []
        for session_id, key in keys.items():
            version, why = checked[key]
            app, epoch_version = epochs[session_id]["app"], epochs[session_id]["app_version"]
            # Unknown (no version loads, or no SessionStart read: a create a full disk cut
            # short) is not older: `loopd upgrade` would be the wrong advice.
            known = version is not None and app is not None
            older = (app, epoch_version) != (key[0], version) if known else None
            rows.append({
                "session": session_id, "named": names[session_id], "app": app,
                "app_version": epoch_version, "loads": key[0], "current": version,
                "older": older, "error": why,
            })  # fmt: skip
        older_count = sum(1 for row in rows if row["older"])
        waiter.client.reply(ok(waiter.request_id, {"sessions": rows, "older": older_count}))

    async def answer_or_fail() -> None:
        try:
            await answer()
        except Exception as exc:  # noqa: BLE001 - the client is told; the daemon goes on
            waiter.client.reply(error(waiter.request_id, "app_versions", f"{exc!r}"[:MAX_WHY]))

    task = loop.create_task(answer_or_fail())
    _running.add(task)  # the loop keeps only a weak reference to a task
    task.add_done_callback(_running.discard)
