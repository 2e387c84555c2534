"""A replicated session's group commit is bounded by what one replication frame carries.

A group is never cut (a follower takes whole groups), so one larger than a
``replicate`` frame could never be shipped: written on the owner, it was taken by no
follower, each was dropped, and every write after it refused until they caught up,
which they never could. Now the owner's store refuses such a write before a byte of it
is written (``Session.max_write``, set by the ``Shipper``), in one line, and the
default App ends a group before a request that could take it past the bound.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import log_user_keys
from tests.test_replication_shipper import BASELINE, LocalFollower, T, _write
from worker import Owner, Session, User
from worker.app import DefaultApp
from worker.replication import MAX_WRITE, Shipper
from worker.store.errors import WriteTooLarge
from worker.store.replica_roles import replicas_root
from worker.wire import REPLICA_MAX_FRAME, Message


def test_a_write_past_the_bound_is_refused_before_a_byte_and_the_session_goes_on(
    tmp_path: Path,
) -> None:
    with Session.create(tmp_path, "s", BASELINE) as session:
        session.max_write = 4096
        size = Path(session.log_path).stat().st_size
        with pytest.raises(WriteTooLarge) as refused:
            session.append(User(time=T, text="x" * 5000, key="big"))
        said = str(refused.value)
        assert said.startswith(f"{session.log_path}: a group commit of ")
        assert "is larger than the 4096 bytes one replicated write may be" in said
        assert "nothing was written" in said
        assert Path(session.log_path).stat().st_size == size
        assert session.find_key("big") is None
        session.append(User(time=T, text="small", key="small"))  # not broken
    assert log_user_keys(tmp_path, "s") == ["small"]


def test_the_default_app_ends_a_group_before_the_bound_and_refuses_one_request_past_it(
    tmp_path: Path,
) -> None:
    app = DefaultApp(budget=10**9)
    with Session.create(tmp_path, "s", BASELINE) as session:
        session.max_write = 40_000
        requests: list[Message] = [{"text": "y" * 1500, "key": f"k{n}"} for n in range(6)]
        requests.insert(3, {"text": "z" * 40_000, "key": "alone-too-big"})
        results = app.handle_many(session, requests)
        refused = results.pop(3)
        assert isinstance(refused, WriteTooLarge)
        assert all(isinstance(r, dict) and r["duplicate"] is False for r in results)
        groups = [r["group"] for r in results if isinstance(r, dict)]
        assert all(isinstance(g, int) and g < 6 for g in groups)  # more than one group commit
    assert log_user_keys(tmp_path, "s") == [f"k{n}" for n in range(6)]


def test_the_shipper_bounds_its_session_to_one_replication_frame(tmp_path: Path) -> None:
    assert MAX_WRITE < REPLICA_MAX_FRAME
    b = LocalFollower("b", tmp_path / "b")
    with Session.create(tmp_path / "a", "s", BASELINE) as owner:
        owner.append(Owner(node="a", token=5))
        assert owner.max_write is None
        shipper = Shipper(owner, 5, 2, [b], ["b"], lambda node, ok: None)
        assert owner.max_write == MAX_WRITE
        owner.on_written = shipper.written
        shipper.start()
        _write(owner, "k1")
        assert shipper.ship() is None
        shipper.close()
        assert owner.max_write is None
    b.receiver.close()
    assert log_user_keys(Path(replicas_root(tmp_path / "b")), "s") == ["k1"]
