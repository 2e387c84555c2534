"""The rig's command line: run with a report, replay one case, the supervised run."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from tests.harness.postgres_server import PostgresServer
from tests.harness.support import loopd


def test_chaos_run_reports_every_case_and_exits_0_on_a_correct_store(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    ran = loopd(
        "chaos",
        "run",
        "--scenario",
        "resume",
        "--faults",
        "kill,io",
        "--no-compound",
        "--jobs",
        "2",
        "--json-report",
        str(report),
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    data = json.loads(report.read_text())
    assert data["violations"] == 0
    ids = [c["id"] for c in data["cases"]]
    assert len(ids) == len(set(ids)) > 20
    first = data["cases"][0]
    assert set(first) >= {"id", "fault", "boundary", "outcome", "invariants"}
    assert first["outcome"] == "ok"
    assert "single-writer" in first["invariants"]
    assert "resume" in ran.stdout
    assert "violations" in ran.stdout


def test_chaos_replay_reproduces_a_case_and_exits_1_on_a_violation() -> None:
    clean = loopd("chaos", "replay", "basic:torn:half:16")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "outcome    ok" in clean.stdout
    broken = loopd("chaos", "replay", "basic:kill:-:3@no-lock")
    assert broken.returncode == 1
    assert "VIOLATION  single-writer" in broken.stdout


def test_chaos_replay_cuts_the_power_after_a_resume_and_catches_an_open_that_syncs_nothing() -> (
    None
):
    clean = loopd("chaos", "replay", "requests:kill:-:58:pend")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "the power failed at its end" in clean.stdout
    broken = loopd("chaos", "replay", "requests:kill:-:58:pend@open-makes-nothing-durable")
    assert broken.returncode == 1
    assert "VIOLATION  acknowledged-on-disk: acknowledged keys lost by the crash: ['q5']" in (
        broken.stdout
    )


def test_chaos_replay_refuses_a_malformed_case_id_clearly() -> None:
    bad = loopd("chaos", "replay", "basic:explode:-:3")
    assert bad.returncode == 2
    assert "unknown fault 'explode'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_supervised_chaos_keeps_every_acknowledged_request_exactly_once() -> None:
    ran = loopd("chaos", "supervised", "--sessions", "3", "--requests", "80",
                "--duration", "60", "--seed", "7")  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "240 requests acknowledged" in ran.stdout
    assert "exactly once" in ran.stdout
    # Workers really died under the load (at write boundaries and from outside).
    restarts = int(ran.stdout.split(" restarts")[0].rsplit(" ", 1)[1])
    assert restarts >= 1


@pytest.mark.timeout(180)
def test_supervised_chaos_on_postgres_keeps_every_acknowledged_request_exactly_once(
    postgres_server: PostgresServer,
) -> None:
    """The worker loop and the data path over ``serve --store``: workers SIGKILLed before
    and after their COMMITs and from outside; every acknowledged key once in the
    database, every session read back whole."""
    uri = postgres_server.new_database()
    ran = loopd("chaos", "supervised", "--sessions", "3", "--requests", "60",
                "--duration", "90", "--seed", "7", "--boundary-kill-probability", "0.05",
                "--store", uri)  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "180 requests acknowledged" in ran.stdout
    assert "exactly once" in ran.stdout
    restarts = int(ran.stdout.split(" restarts")[0].rsplit(" ", 1)[1])
    assert restarts >= 1
    with psycopg.connect(uri) as conn:  # the sessions were in the database, not the home
        row = conn.execute("SELECT count(DISTINCT session) FROM loopd_log_chunks").fetchone()
    assert row == (3,)
