"""What a slice-at-a-time catch-up holds between its calls, on real files in one process.

``worker.catch_up`` reads one step at a time from a cursor (the copy's position): a new
copy of a large session costs the worker about one step of memory, not the whole log
(before, every step after the copy's position was read at the start of a round and
kept until the last was shipped).
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from tests.test_replication_shipper import BASELINE, LocalFollower, T
from worker import Owner, Session, User
from worker.replication import MAX_STEP, Shipper


def test_a_catch_up_holds_no_more_than_a_few_pieces_between_its_calls(tmp_path: Path) -> None:
    a, c = tmp_path / "a", tmp_path / "c"
    with Session.create(a, "s", BASELINE) as owner:
        owner.append(Owner(node="a", token=5))
        for i in range(20):  # about 4 MB of log in one epoch
            owner.append_many([User(time=T, text="x" * 200_000, key=f"big{i}")])
        size = Path(owner.log_path).stat().st_size
        to_c = LocalFollower("c", c)
        shipper = Shipper(owner, 5, 3, [to_c], [], lambda _n, _ok: None, required=1)
        try:
            tracemalloc.start()
            before, _peak = tracemalloc.get_traced_memory()
            assert shipper.rejoin(["c"], budget=0.0) == []  # the first piece only
            held, _peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            at = to_c.position("s")
            assert at is not None
            assert at.size < size  # the copy is being caught up
            assert held - before <= 4 * MAX_STEP, f"{held - before} bytes held of a {size} B log"
        finally:
            shipper.close()
            to_c.receiver.close()
