"""A copy changing roles: a follower promoted to owner, the returning old owner demoted.

The old owner's unacknowledged suffix (what it wrote past the new owner's prefix) is
moved to quarantine, never deleted; what is left is a prefix of the new owner's log,
and as a follower's copy it catches up to the new owner byte for byte.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import log_user_keys
from worker import Assistant, Baseline, Owner, Session, SessionNotFound, User
from worker.store.fencing import write_owner
from worker.store.loader import load_session
from worker.store.replica import Replica
from worker.store.replica_roles import demote, line_ends, promote, replicas_root, shared_prefix
from worker.store.replica_source import steps_after
from worker.store.replica_types import Position, ReplicaRefused

BASELINE = Baseline(system="s", memory="m", tools=[])
T = "2026-12-01T17:30:00.000000Z"


def _write(session: Session, key: str) -> None:
    session.append_many([User(time=T, text=key, key=key), Assistant(time=T, text=f"a {key}")])


def _follow(owner_home: Path, follower_home: Path, token: int) -> None:
    root = replicas_root(follower_home)
    try:
        replica = Replica.open(root, "s")
    except SessionNotFound:  # the first sync makes the copy
        replica = None
    for step in steps_after(owner_home, "s", replica.position if replica else None, token):
        if replica is None:
            replica = Replica.create(root, step)
        else:
            replica.apply(step)
    assert replica is not None
    replica.close()


@pytest.mark.parametrize("commit_after_shipping", [False, True])
def test_failover_keeps_every_shipped_write_and_quarantines_the_rest(
    tmp_path: Path, commit_after_shipping: bool
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    with Session.create(a, "s", BASELINE) as old:
        old.append(Owner(node="a", token=5))
        for key in ("k1", "k2", "k3"):
            _write(old, key)
        _follow(a, b, 5)  # b acknowledged everything up to k3
        if commit_after_shipping:
            old.commit_epoch("never shipped", BASELINE)
        for key in ("k4", "k5"):  # durable on a only: never acknowledged
            _write(old, key)
    # b takes over (etcd gave it token 9): its copy opens as it is.
    promote(b, "s")
    with Session.open(b, "s") as new:
        write_owner(new, "b", 9)
        _write(new, "k6")
    # a returns: it keeps what b's log begins with, the rest goes to quarantine.
    newest, _ends = line_ends(a, "s")
    for epoch in range(newest, -1, -1):  # newest first, older while none is shared
        keep = shared_prefix(b, "s", *line_ends(a, "s", epoch))
        if keep is not None:
            break
    assert keep is not None
    assert keep.epoch == 0
    moved = demote(a, "s", keep)
    quarantined = b"".join(Path(p).read_bytes() for p in moved)
    assert b'"key":"k4"' in quarantined
    assert b'"key":"k5"' in quarantined
    _follow(b, a, 9)
    copy = Path(replicas_root(a), "sessions", "s")
    load_session(str(copy), "s", history=True)
    assert log_user_keys(Path(replicas_root(a)), "s") == ["k1", "k2", "k3", "k6"]
    for log in (b / "sessions" / "s").glob("*.jsonl"):
        assert (copy / log.name).read_bytes() == log.read_bytes()
    assert not (a / "sessions" / "s").exists()


def test_demote_refuses_a_position_its_log_does_not_begin_with(tmp_path: Path) -> None:
    with Session.create(tmp_path, "s", BASELINE) as session:
        _write(session, "k1")
        size = Path(session.log_path).stat().st_size
    for keep, words in [
        (Position(0, size, 1), "does not begin with"),
        (Position(0, size - 3, 0), "does not begin with"),
        (Position(4, 10, 0), "no epoch 4 here"),
    ]:
        with pytest.raises(ReplicaRefused) as caught:
            demote(tmp_path, "s", keep)
        assert words in str(caught.value)
        assert "\n" not in str(caught.value)
    with Session.open(tmp_path, "s") as session:  # nothing changed
        assert session.find_key("k1") is not None
