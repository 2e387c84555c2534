"""The systemd unit of docs/operations.md ("systemd"), with a home's paths filled in.

``loopd systemd-unit --home H`` prints :data:`UNIT` with the home, the ``loopd``
executable of the running interpreter and the service's user substituted; the
documented unit is the same template with ``/var/lib/loopd``, ``/opt/loopd/venv/bin/loopd``
and ``loopd`` (a test holds the two together).
"""

from __future__ import annotations

import os
import pwd
import re
import sys
from typing import Final

from supervisor.errors import SupervisorError

UNIT: Final = """\
# /etc/systemd/system/loopd.service
[Unit]
Description=loopd session supervisor
After=local-fs.target

[Service]
Type=notify
NotifyAccess=main
User={user}
{environment}
ExecStart={exec_start}
# READY=1 comes once the socket listens and every session is started or hibernated.
TimeoutStartSec=300
WatchdogSec=30
# A hard memory limit for the supervisor and all its workers (the kernel enforces it).
MemoryMax=24G
# SIGTERM stops every worker (SIGTERM, 5 s, SIGKILL) and exits 0.
KillMode=mixed
TimeoutStopSec=30
Restart=on-failure
# A restart is downtime: scheduled requests due meanwhile wait for it (systemd's
# start limit, 5 starts in 10 s, still ends a crash loop).
RestartSec=100ms

[Install]
WantedBy=multi-user.target
"""
USER_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,255}")
_NEEDS_QUOTES: Final = frozenset(" \t\"'\\;")


class UnitError(SupervisorError):
    """A value that cannot stand in a unit file; ``str()`` is one line naming it."""


def loopd_command() -> list[str]:
    """How the service starts ``loopd``: the ``loopd`` script beside this interpreter
    (a virtualenv's ``bin/``), else this interpreter with ``-m supervisor``.

    ``sys.executable`` is made absolute but not resolved: a virtualenv's ``python`` is a
    symbolic link, and resolving it would leave the virtualenv.
    """
    python = os.path.abspath(sys.executable)
    script = os.path.join(os.path.dirname(python), "loopd")
    if os.path.isfile(script) and os.access(script, os.X_OK):
        return [script]
    return [python, "-m", "supervisor"]


def default_user(home: str) -> str:
    """The user the service runs as: the owner of the home if it exists (its files and
    its socket must be that user's), else the user running this command."""
    try:
        uid = os.stat(home).st_uid
    except OSError:
        uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def render_unit(*, home: str, command: list[str], user: str) -> str:
    """The unit with its values in place; UnitError for one that systemd would misread."""
    if not USER_NAME.fullmatch(user):
        raise UnitError(f"--user {user!r}: not a user name systemd takes")
    if not os.path.isabs(home):
        raise UnitError(f"--home {home!r}: must be an absolute path here")
    return UNIT.format(
        user=user,
        environment=f"Environment={_word(f'LOOPD_HOME={home}', 'the home')}",
        exec_start=" ".join(
            [*(_word(part, "the loopd path", exec_line=True) for part in command), "serve"]
        ),
    )


def _word(text: str, what: str, *, exec_line: bool = False) -> str:
    """``text`` as one word of a unit line: ``%`` (a specifier) doubled, ``$`` doubled on
    an ``ExecStart=`` line, quoted with C escapes when it holds a space or a quote."""
    bad = next((c for c in text if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise UnitError(f"{what} {text!r} holds the control character {bad!r}")
    try:  # a unit file is UTF-8: a path's undecodable bytes (surrogates here) cannot be one
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UnitError(f"{what} {text!r} is not UTF-8 text, which a unit file must be") from exc
    text = text.replace("%", "%%")
    if exec_line:
        text = text.replace("$", "$$")
    if not _NEEDS_QUOTES.intersection(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
