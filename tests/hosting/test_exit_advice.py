"""What serve tells an operator of a refused log: a step that works where the session is."""

from __future__ import annotations

import pytest

from supervisor.sessions.exit_advice import fatal_reason
from worker.process import EXIT_REFUSED

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
