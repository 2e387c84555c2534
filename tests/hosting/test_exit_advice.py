"""What serve tells an operator of a refused log: a step that works where the session is."""

from __future__ import annotations

import pytest

from supervisor.sessions.exit_advice import fatal_reason, outage_wait
from worker.process import EXIT_CRASH, EXIT_DATABASE, EXIT_DISK_FULL, EXIT_REFUSED

KINDS = ["torn_tail", "newest", "sealed", "missing_baseline", "key_index", "baseline", None]


@pytest.mark.parametrize("kind", KINDS)
def test_a_refused_log_in_a_database_is_given_the_store_tools_never_the_homes(
    kind: str | None,
) -> None:
    said = fatal_reason(EXIT_REFUSED, "p:3: checksum mismatch", "/srv/h", "s1", kind=kind,
                        stored=True)  # fmt: skip
    assert said is not None
    assert "`loopd inspect --store URI s1`" in said
    assert "--home" not in said  # the home's tools read files the database does not have


@pytest.mark.parametrize("kind", KINDS)
def test_a_refused_log_in_a_home_is_given_that_homes_tools(kind: str | None) -> None:
    said = fatal_reason(EXIT_REFUSED, "p:3: checksum mismatch", "/srv/h", "s1", kind=kind)
    assert said is not None
    assert "--home /srv/h" in said
    assert "--store" not in said


def test_an_outage_says_what_the_session_waits_for_and_a_full_pool_how_to_make_room() -> None:
    assert outage_wait(EXIT_CRASH, "/srv/h") is None  # a crash: restarted, counted
    assert fatal_reason(EXIT_DISK_FULL, "x", "/srv/h", "s1") is None  # never FATAL
    full = outage_wait(EXIT_DISK_FULL, "/srv/h", "p: write failed: [ENOSPC]")
    assert full is not None
    assert "the filesystem of /srv/h is full: started again until space is freed" in full
    away = outage_wait(EXIT_DATABASE, "/srv/h", "connection refused")
    assert away == "waiting for the database: started again until it answers"
    crowded = outage_wait(EXIT_DATABASE, "/srv/h", "FATAL: sorry, too many clients already")
    assert crowded is not None
    assert "max_connections" in crowded
    assert "--max-live" in crowded
    assert "PgBouncer" in crowded
