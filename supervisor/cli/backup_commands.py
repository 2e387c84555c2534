"""``loopd backup`` and ``loopd restore``: a consistent copy of a live session, and back.

The copy's point (where the newest log is cut) is named by the session's worker through
the daemon (``backup_point``); with no daemon, or a session not running, the copy is
taken under the session's lock (worker.offline.backup). A worker killed while it is asked
is asked again once it is back, until ``--timeout``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Final, NoReturn

import click

from supervisor.cli.offline.offline_commands import (
    EXIT_REFUSED,
    home_given,
    home_unless_store_option,
)
from supervisor.cli.offline.store_tools import backup_from_store, restore_into_store, store_option
from supervisor.cli.options import timeout_option
from supervisor.client.control import RETRYABLE, call, daemon_answers
from supervisor.daemon.worker_specs import UnknownApp
from supervisor.errors import ControlError, ServeError
from supervisor.hosting.apps import AppConfigError
from supervisor.hosting.config import ConfigError, config_path, read_apps
from supervisor.hosting.intent import IntentError, IntentFile
from supervisor.moves.session_files import TENANTS_DIR, read_tenant
from supervisor.sessions.tenants import OPERATOR, TenantBook, TenantError, tenant_problem
from worker.offline.backup import MANIFEST, BackupError, Point, PointMoved, backup_session
from worker.offline.restore import Manifest, check_backup, restore_session, restored_id
from worker.offline.restore_drops import Drop, DropNotConfirmed, work_dropped
from worker.store.disk.layout import SESSIONS_DIR, session_dir
from worker.store.errors import SessionError
from worker.store.session_id import validate_session_id

MAX_ATTEMPTS: Final = 20
"""Copies begun again because an epoch commit replaced a file the point needed."""
RETRY_PAUSE: Final = 0.05
LIVE_STATES: Final = frozenset({"RUNNING", "STARTING", "BACKOFF", "IDLE", "STOPPING"})
WORKING: Final = frozenset({"RUNNING", "STARTING", "BACKOFF"})
"""States in which the session's worker runs, or is about to: it is asked for the point."""


def _fail(command: str, why: object) -> NoReturn:
    click.echo(f"loopd {command}: {why}", err=True)
    sys.exit(EXIT_REFUSED)


def worker_point(home: str, session_id: str, deadline: float) -> Point | None:
    """The durable point the session's worker names; None if no worker runs it (no daemon,
    not hosted, stopped, refused or hibernated, which a backup does not wake: the newest
    log is then cut at its last whole group)."""
    if _hosted_state(home, session_id, max(0.1, deadline - time.monotonic())) not in WORKING:
        return None
    while True:
        left = max(0.1, deadline - time.monotonic())
        try:
            answer = call(home, "backup_point", timeout=left, session=session_id)
        except ControlError as exc:
            if exc.code in ("no_daemon", "not_found", "unavailable"):
                return None
            if exc.code in RETRYABLE and time.monotonic() < deadline:
                time.sleep(RETRY_PAUSE)  # the worker was killed or is restarting: ask again
                continue
            raise
        if not isinstance(answer, dict):
            raise ControlError("bad_reply", f"backup_point answered {answer!r:.80}")
        return Point(int(answer["epoch"]), int(answer["bytes"]), "worker")


def _named_app(home: str, session_id: str) -> str | None:
    """The named App the session was created with (intent.json), for its restore."""
    intent = IntentFile(home)
    try:
        intent.load()
    except IntentError as exc:
        click.echo(f"loopd backup: {exc}; the backup does not name the session's App", err=True)
        return None
    return intent.app_of(session_id)


def _backup_one(home: str, session_id: str, dest: str, deadline: float) -> bool:
    app = _named_app(home, session_id)
    tenant = read_tenant(os.path.join(home, TENANTS_DIR, session_id))
    for _attempt in range(MAX_ATTEMPTS):
        point = worker_point(home, session_id, deadline)
        try:
            result = backup_session(home, session_id, dest, point, app, tenant)
        except PointMoved:
            continue
        break
    else:
        _fail("backup", f"{session_id}: epoch commits kept replacing its files; try again")
    where = f"epoch {result.point.epoch}'s log up to byte {result.point.size}"
    if result.point.named_by == "worker":
        how = "a group boundary its worker named, all of it durable"
    else:
        how = "its last whole group: no worker runs it"
        if result.left:
            how += f"; the {result.left} bytes after it (a torn tail?) are not copied"
    click.echo(
        f"backed up {session_id} to {result.directory}: {result.files} files, "
        f"{result.size} bytes; {where} ({how})"
    )
    if result.refused is not None:
        click.echo(f"loopd backup: the copy of {session_id} is refused: {result.refused}", err=True)
        return False
    return True


@click.command()
@home_unless_store_option
@store_option
@timeout_option
@click.option("--all", "every", is_flag=True, help="Back up every session of the home.")
@click.argument("args", nargs=-1, metavar="[ID] DEST")
def backup(
    home: str | None, store: str | None, timeout: float, every: bool, args: tuple[str, ...]
) -> None:
    """Copy session ID (or --all) into DEST/ID, consistently, while it runs.

    Sealed epochs as they are, the newest log up to a group boundary its worker names,
    every file fsynced, and a manifest of their SHA-256 digests. Exits 1 if a copy is
    refused by the loader (it is kept, for a look). With ``--store URI`` session ID is
    copied out of that PostgreSQL store as of one snapshot (``loopd restore`` puts it
    into a home).
    """
    if len(args) != (1 if every else 2) or (store is not None and every):
        _fail("backup", "expected ID DEST, or --all DEST (a home's)")
    dest = os.path.abspath(args[-1])
    if os.path.lexists(dest) and not os.path.isdir(dest):
        _fail("backup", f"{dest}: not a directory (DEST is the folder the backup of ID goes in)")
    if store is not None:
        backup_from_store(store, args[0], dest)
        return
    home = home_given("backup", home)
    deadline = time.monotonic() + timeout
    if not every:
        try:
            good = _backup_one(home, validate_session_id(args[0]), dest, deadline)
        except (ControlError, SessionError) as exc:
            _fail("backup", exc)
        sys.exit(0 if good else EXIT_REFUSED)
    failed = 0
    for session_id in sorted(os.listdir(os.path.join(home, SESSIONS_DIR))):
        try:  # one session that cannot be copied does not stop the others
            failed += not _backup_one(home, validate_session_id(session_id), dest, deadline)
        except (ControlError, SessionError) as exc:
            failed += 1
            click.echo(f"loopd backup: {session_id}: {exc}", err=True)
    if failed:
        _fail("backup", f"not backed up: {failed} of the sessions (each named above)")


def _source(src: str, session_id: str | None) -> str:
    if os.path.exists(os.path.join(src, MANIFEST)):
        return src
    if session_id is not None and os.path.exists(os.path.join(src, session_id, MANIFEST)):
        return os.path.join(src, session_id)
    raise BackupError(src, f"holds no {MANIFEST}: not a backup of one session (or of ID in it)")


@click.command()
@home_unless_store_option
@store_option
@timeout_option
@click.option("--force", is_flag=True, help="Stop the session and move it to the trash first.")
@click.option(
    "--dropping",
    metavar="TOKEN",
    default="",
    help="With --force: the token restore printed for the work acknowledged after the "
    "backup that it drops; it replaces the session only if that is still all it drops.",
)
@click.option(
    "--tenant",
    metavar="NAME",
    default=None,
    help="Give the restored session to tenant NAME (loopd-operator: to no tenant). "
    "Without it, a restore into the home the backup was taken from gives the session "
    "back to the backup's tenant, and one into another home to no tenant.",
)
@click.argument("src", type=click.Path(file_okay=False))
@click.argument("session_id", metavar="[ID]", required=False)
def restore(
    home: str | None,
    store: str | None,
    timeout: float,
    force: bool,
    dropping: str,
    tenant: str | None,
    src: str,
    session_id: str | None,
) -> None:
    """Put back the backup SRC (or SRC/ID of a --all backup) as a session of the home.

    The manifest is checked first. A session that is there, or live, is not replaced
    unless --force: then it is stopped and its directory moved to <home>/trash/. If it
    holds work acknowledged after the backup's point, restore lists those keys and
    records and refuses; --force --dropping TOKEN (the token it printed) drops exactly
    those. With ``--store URI`` the session is created in that PostgreSQL store (not
    replaced: it must not be there), the way a home's session moves to a database.
    """
    if store is not None:
        try:
            source = _source(src, session_id)
            manifest = check_backup(source)
            wanted = restored_id(manifest, session_id, source)
        except SessionError as exc:
            _fail("restore", exc)
        restore_into_store(store, wanted, manifest.files, source)
        return
    home = home_given("restore", home)
    if dropping and not force:
        _fail("restore", "--dropping confirms what --force drops: give both")
    if tenant is not None and (problem := tenant_problem(tenant)):
        _fail("restore", f"--tenant: {problem}")
    try:
        source = _source(src, session_id)
        manifest = check_backup(source)
        wanted = session_id or manifest.session
        live = daemon_answers(home, timeout)
        if live:
            state = _hosted_state(home, wanted, timeout)
            if state is None and not force and os.path.lexists(session_dir(home, wanted)):
                _fail("restore", f"{session_dir(home, wanted)} already exists and serve does "
                      "not list it (a restore cut short after its rename?): `loopd restore "
                      "--force` replaces it with the backup; a restart of serve lists it as "
                      "it is")  # fmt: skip
            if state in LIVE_STATES and not force:
                _fail("restore", f"session {wanted} is {state}; --force stops it and replaces it")
            if state in LIVE_STATES:
                # Listed before its worker is stopped for a replace that would be refused;
                # restore_session reads it again under the session's lock.
                drop = work_dropped(session_dir(home, wanted), manifest.files)
                if drop.records and drop.token != dropping:
                    _refuse_drop(wanted, drop)
                call(home, "stop", timeout=timeout, session=wanted)
        owner = _restored_tenant(home, manifest, tenant)
        if manifest.app is not None:
            _check_app(home, wanted, manifest.app)
        result = restore_session(home, source, wanted, replace=force, dropping=dropping)
        app = {} if manifest.app is None else {"app": manifest.app}
        if live:
            call(home, "adopt", timeout=timeout, session=wanted, owner=owner or OPERATOR, **app)
        else:
            TenantBook(home).assign(wanted, owner)  # read by serve at its start
            if manifest.app is not None:
                intent = IntentFile(home)
                intent.load()
                intent.set_app(wanted, manifest.app)
    except DropNotConfirmed as exc:
        _refuse_drop(wanted, exc.drop, changed=bool(dropping))
    except (ControlError, SessionError, IntentError, TenantError, ServeError) as exc:
        _fail("restore", exc)
    if result.replaced is not None:
        click.echo(f"moved the session that was there to {result.replaced}")
    if result.dropped.records:
        _list_drop(result.dropped)
        click.echo(
            f"dropped {result.dropped.describe()} acknowledged after the backup's point "
            "(listed above; kept in the trash): a client that sends one of these keys again "
            "has it applied again"
        )
    click.echo(
        f"restored {wanted} from {source} (taken {manifest.taken}): "
        f"{len(manifest.files)} files, each matching the manifest"
    )
    click.echo(f"it verifies; next: loopd start {wanted}")
    if owner is not None:
        click.echo(f"it is tenant {owner!r}'s, as when it was backed up")
    elif manifest.tenant is not None and tenant is None:
        click.echo(
            f"it is the operator's: the backup's tenant {manifest.tenant!r} was of another home "
            f"({manifest.home}); --tenant {manifest.tenant} gives it to that tenant here"
        )


def _check_app(home: str, session_id: str, app: str) -> None:
    """Exit 1, nothing restored, if the home's loopd.toml names no App ``app`` (serve
    would refuse to start with a session of an App it does not know)."""
    try:
        known = read_apps(config_path(home))
    except (ConfigError, AppConfigError) as exc:
        _fail("restore", f"{exc}; nothing was restored")
    if app not in known:
        _fail("restore", f"{UnknownApp(session_id, app, sorted(known))}; nothing was restored")


def _restored_tenant(home: str, manifest: Manifest, given: str | None) -> str | None:
    """Whose the restored session is: ``--tenant`` if given; else the backup's tenant if
    it was taken from this very home (a tenant's name is only known to mean the same
    party in the home whose tokens and CA named it); else the operator's (None)."""
    if given is not None:
        return None if given == OPERATOR else given
    if manifest.tenant is not None and manifest.home == os.path.realpath(home):
        return manifest.tenant
    return None


def _list_drop(drop: Drop) -> None:
    for key in drop.keys:
        click.echo(key)


def _refuse_drop(session_id: str, drop: Drop, *, changed: bool = False) -> NoReturn:
    """List the keys restore would drop on stdout; one line on stderr says how to confirm."""
    _list_drop(drop)
    why = (
        "it changed since the token was printed (a session stopped for it stays stopped); "
        if changed
        else ""
    )
    _fail(
        "restore",
        f"refused: session {session_id} holds {drop.describe()} acknowledged after the "
        f"backup's point (their keys listed above), which restoring drops; {why}to replace "
        f"it and drop exactly these, run again with --force --dropping {drop.token}",
    )


def _hosted_state(home: str, session_id: str, timeout: float) -> str | None:
    """The session's state in the daemon; None if no daemon runs or it does not host it."""
    try:
        rows = call(home, "status", timeout=timeout, session=session_id)
    except ControlError as exc:
        if exc.code in ("not_found", "no_daemon"):
            return None
        raise
    row = rows[0] if isinstance(rows, list) and rows else {}
    return str(row.get("state")) if isinstance(row, dict) else None


COMMANDS: Final = (backup, restore)
