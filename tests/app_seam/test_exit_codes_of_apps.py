"""An App that exits with one of loopd's own exit codes is a crash, not a diagnosis."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from supervisor.client import Client, call
from supervisor.errors import ControlError
from tests.harness.support import poll_until, running_daemon, status

CODES = (3, 4, 5, 6, 7, 8)  # locked, refused, not found, cannot open, not owner, database


def _restarted(home: Path, session: str) -> dict[str, object] | None:
    row = status(home, session)
    return row if row["state"] == "RUNNING" and int(str(row["restarts"])) >= 1 else None


def test_an_app_that_exits_with_loopds_own_codes_is_restarted_as_a_crash(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--app", "tests.apps.exit_code_apps:ExitingApp"):
        for code in CODES:
            call(str(home), "create", session=f"x{code}")
        with Client(str(home), timeout=60) as client:
            for code in CODES:
                with pytest.raises(ControlError):
                    client.send(f"x{code}", f"exit {code}", key=f"k{code}")

        for code in CODES:
            # Before, a 3 waited on a lock nobody held, and 4, 5, 6 and 7 left the session
            # FATAL with a false diagnosis (a healthy log called refused, say). The client
            # sent the request again after each death: it is refused as poison at the third.
            row = poll_until(functools.partial(_restarted, home, f"x{code}"), timeout=30,
                             what=f"x{code} restarted as a crash")  # fmt: skip
            assert f"exit code {code}" in str(row["last_error"]), row
        with Client(str(home), timeout=60) as client:
            for code in CODES:
                assert client.send(f"x{code}", "after", key=f"a{code}")["text"] == "echo: after"
