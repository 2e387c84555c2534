"""``Client.send_many`` when its worker dies after some replies of the pipeline were read:
those requests keep the outcome their replies gave (applied), and only the rest is sent
again."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.client import Client, Request, call
from tests.harness.support import log_user_keys, running_daemon


@pytest.mark.parametrize(
    ("always", "pad", "last"),
    [(False, 0, "applied"), (True, 0, "refused"), (False, 20_000, "applied")],
    ids=["dies-once", "dies-always", "dies-once-large-pipeline"],
)
def test_replies_read_before_the_worker_died_keep_their_outcome(
    tmp_path: Path, always: bool, pad: int, last: str
) -> None:
    """``pad`` characters make the pipeline larger than one blocking write takes, so it
    goes through the selector's write-while-reading path."""
    home = tmp_path / "home"
    env = {"LOOPD_TEST_DIE_ALWAYS": "1"} if always else {}
    # One request a chunk: each reply is flushed before the next request is handled.
    args = ("--app", "tests.apps.ops_apps:DiesOnDieApp", "--max-batch", "1", "--poison-after", "2")
    with running_daemon(home, *args, env=env):
        call(str(home), "create", session="s")
        with Client(str(home), timeout=20, retry_for=20) as client:
            outcomes = client.send_many(
                "s",
                [
                    Request(text=t, key=k)
                    for t, k in (
                        ("one" + "x" * pad, "k1"),
                        ("two" + "y" * pad, "k2"),
                        ("die", "k3"),
                    )
                ],
            )
    assert (home / "died").exists()
    assert [(o["key"], o["outcome"]) for o in outcomes] == [
        ("k1", "applied"), ("k2", "applied"), ("k3", last),
    ]  # fmt: skip
    assert log_user_keys(home, "s") == (["k1", "k2"] if always else ["k1", "k2", "k3"])
    if always:
        error = outcomes[2]["error"]
        assert isinstance(error, dict)
        assert error["code"] == "poison_request", error
