"""A follower's copy of a session: the owner's steps applied, checked before each write.

After every applied step the copy opens and verifies as any session does and holds a
prefix of the owner's log; a step that does not continue the copy, that is not whole
checksummed groups, or that carries a token lower than the copy has seen, is refused
in one line with nothing written.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.forge import chain
from tests.support import poll_until
from worker import Assistant, Baseline, Owner, Session, ToolResult, User
from worker.store.layout import session_dir
from worker.store.loader import load_session
from worker.store.replica import Replica
from worker.store.replica_fences import fence_path
from worker.store.replica_source import split_step, steps_after, whole_groups_end
from worker.store.replica_types import NotContinuing, Position, ReplicaRefused, StaleToken, Step

BASELINE = Baseline(system="s", memory="m", tools=[])
T = "2026-12-01T17:00:00.000000Z"


def _request(session: Session, n: int, *, tool: bool = False, size: int = 1) -> None:
    batch: list[User | ToolResult | Assistant] = [User(time=T, text=f"r{n}", key=f"k{n}")]
    if tool:
        batch.append(ToolResult(time=T, call=session.next_call(), tool="t", output="o", ok=True))
    batch += [Assistant(time=T, text=f"a{n}.{i}") for i in range(size - 1)]
    session.append_many(batch)


def _files(directory: str) -> dict[str, bytes]:
    return {
        name: Path(directory, name).read_bytes()
        for name in sorted(os.listdir(directory))
        if not name.endswith(".tmp")
    }


def _check_copy(owner_dir: str, copy_dir: str, session_id: str) -> None:
    """The copy opens and verifies, and each of its logs is a prefix of the owner's."""
    load_session(copy_dir, session_id)
    load_session(copy_dir, session_id, history=True)
    mine, theirs = _files(copy_dir), _files(owner_dir)
    for name, data in mine.items():
        if name.endswith(".jsonl"):
            assert theirs[name].startswith(data), name


def _sync(owner_home: Path, root: Path, replica: Replica | None, token: int) -> Replica:
    steps = steps_after(owner_home, "s", replica.position if replica else None, token)
    for step in steps:
        if replica is None:
            replica = Replica.create(root, step)
        else:
            replica.apply(step)
        _check_copy(str(owner_home / "sessions" / "s"), replica.dir, "s")
    assert replica is not None
    return replica


def test_copy_follows_the_owner_through_groups_owners_and_epochs(tmp_path: Path) -> None:
    owner_home, root = tmp_path / "owner", tmp_path / "replicas"
    n = 0
    with Session.create(owner_home, "s", BASELINE) as owner:
        replica = _sync(owner_home, root, None, 0)
        owner.append(Owner(node="a", token=7))
        for epoch in range(5):
            for _ in range(3):
                n += 1
                _request(owner, n, tool=n % 2 == 0, size=1 + n % 3)
                replica = _sync(owner_home, root, replica, 7)
            owner.commit_epoch(f"summary {epoch}", BASELINE)
            replica = _sync(owner_home, root, replica, 7)
        newest = Path(owner.log_path).read_bytes()
        assert replica.position == Position(owner.epoch, len(newest), zlib.crc32(newest))
    replica.close()
    # Byte for byte the owner's directory: logs, baselines and the derived key index.
    assert _files(session_dir(root, "s")) == _files(str(owner_home / "sessions" / "s"))
    with Session.open(root, "s") as copy:  # a promoted copy needs no repair
        assert copy.find_key("k1") is not None
        assert copy.fence.token == 7


def test_a_step_resent_after_a_lost_ack_changes_nothing(tmp_path: Path) -> None:
    owner_home, root = tmp_path / "owner", tmp_path / "replicas"
    with Session.create(owner_home, "s", BASELINE) as owner:
        replica = _sync(owner_home, root, None, 0)
        _request(owner, 1, size=3)
        (step,) = steps_after(owner_home, "s", replica.position, 0)
        replica.apply(step)
        at = replica.position
        assert replica.apply(step) == at
    replica.close()


def _owner_with_groups(home: Path, groups: int) -> None:
    with Session.create(home, "s", BASELINE) as owner:
        owner.append(Owner(node="a", token=5))
        for n in range(groups):
            _request(owner, n, size=3)


def test_refusals_write_nothing(tmp_path: Path) -> None:
    owner_home, root = tmp_path / "owner", tmp_path / "replicas"
    _owner_with_groups(owner_home, 2)
    first, rest = steps_after(owner_home, "s", None, 5)
    with Replica.create(root, first) as replica:
        groups = split_step(rest, 1)
        assert len(groups) == 3  # the Owner, then two groups of three lines
        replica.apply(groups[0])
        log = Path(replica.dir, "0.jsonl")
        before = log.read_bytes()
        group = groups[1]

        def refused(kind: type[ReplicaRefused], step: Step, words: str) -> None:
            with pytest.raises(kind) as caught:
                replica.apply(step)
            assert words in str(caught.value)
            assert "\n" not in str(caught.value)
            assert log.read_bytes() == before

        torn = group.data[: group.data.index(b"\n", group.data.index(b"\n") + 1) + 1]
        refused(ReplicaRefused, _with(group, data=torn), "incomplete group")
        refused(ReplicaRefused, _with(group, data=group.data[:-1]), "has no newline")
        flipped = group.data.replace(b'"r0"', b'"r9"')
        refused(ReplicaRefused, _with(group, data=flipped), "does not continue the copy's chain")
        refused(NotContinuing, _with(group, offset=group.offset - 1), "does not continue")
        refused(NotContinuing, _with(group, prior_crc=group.prior_crc ^ 1), "does not continue")
        refused(NotContinuing, groups[2], "does not continue the copy")
        refused(StaleToken, _with(group, token=4), "token 4 is lower than 5")
        refused(ReplicaRefused, _with(group, session="t"), "of session 't'")
        # A forger's lines, checksums recomputed: a key applied twice is still refused.
        lines = before.split(b"\n")[:-1]
        again = chain([*lines, *group.data.split(b"\n")[:-1], *group.data.split(b"\n")[:-1]])
        dup = _with(group, data=again[len(before) + len(group.data) :])
        replica.apply(group)
        before = log.read_bytes()
        dup = _with(dup, offset=len(before), prior_crc=zlib.crc32(before))
        refused(ReplicaRefused, dup, "request key 'k0'")
        replica.apply(groups[2])
    load_session(session_dir(root, "s"), "s", history=True)


def _with(step: Step, **changes: object) -> Step:
    return dataclasses.replace(step, **changes)  # type: ignore[arg-type]


def test_a_lower_token_is_refused_once_a_higher_one_was_seen(tmp_path: Path) -> None:
    owner_home, root = tmp_path / "owner", tmp_path / "replicas"
    _owner_with_groups(owner_home, 2)
    first, rest = steps_after(owner_home, "s", None, 5)
    owner_line, g1, g2 = split_step(rest, 1)
    with Replica.create(root, first) as replica:
        replica.apply(owner_line)
        # A new owner (token 9) ships the next group: from then on 5 is deposed.
        replica.apply(_with(g1, token=9))
        assert replica.highest_token == 9
    assert Path(fence_path(str(root), "s")).read_bytes() == b"9\n"
    with Replica.open(root, "s") as replica:  # remembered across a restart
        with pytest.raises(StaleToken, match="token 5 is lower than 9"):
            replica.apply(g2)
        replica.apply(_with(g2, token=9))


def test_an_epoch_step_that_is_not_the_copys_next_is_refused(tmp_path: Path) -> None:
    owner_home, root = tmp_path / "owner", tmp_path / "replicas"
    with Session.create(owner_home, "s", BASELINE) as owner:
        _request(owner, 1)
        replica = _sync(owner_home, root, None, 0)
        owner.commit_epoch("one", BASELINE)
        end, start = steps_after(owner_home, "s", replica.position, 0)
        with pytest.raises(NotContinuing, match="without EpochEnd"):
            replica.apply(start)
        replica.apply(end)
        forged = chain([start.data[:-1].replace(b'"prior_users":1', b'"prior_users":0')])
        with pytest.raises(ReplicaRefused, match="prior_users is 0, the copy carries 1"):
            replica.apply(_with(start, data=forged))
        with pytest.raises(ReplicaRefused, match="baseline hashes to"):
            replica.apply(_with(start, baseline=b"{}\n"))
        replica.apply(start)
        replica.close()
    _check_copy(str(owner_home / "sessions" / "s"), session_dir(root, "s"), "s")


def test_the_owner_refuses_a_diverged_position_in_one_line(tmp_path: Path) -> None:
    owner_home = tmp_path / "owner"
    _owner_with_groups(owner_home, 1)
    data = (owner_home / "sessions" / "s" / "0.jsonl").read_bytes()
    good = data.index(b"\n") + 1
    cases = [
        (Position(0, good, zlib.crc32(data[:good]) ^ 1), "the copy diverged"),
        (Position(0, good - 1, zlib.crc32(data[: good - 1])), "no line ending there"),
        (Position(0, len(data) + 1, 0), "no line ending there"),
        (Position(3, 10, 0), "the copy is ahead of the owner"),
    ]
    for position, words in cases:
        with pytest.raises(NotContinuing) as caught:
            steps_after(owner_home, "s", position, 5)
        assert words in str(caught.value)
        assert "\n" not in str(caught.value)
    assert steps_after(owner_home, "s", Position(0, len(data), zlib.crc32(data)), 5) == []


def test_a_group_being_written_is_not_shipped(tmp_path: Path) -> None:
    home = tmp_path / "owner"
    _owner_with_groups(home, 2)
    data = (home / "sessions" / "s" / "0.jsonl").read_bytes()
    lines = data.split(b"\n")[:-1]
    whole = len(data)
    partial = data + lines[2] + b"\n" + lines[3][:10]  # part 1 of a new group, part 2 torn
    assert whole_groups_end(partial, 0) == whole
    assert whole_groups_end(data + lines[2] + b"\n", 0) == whole
    assert whole_groups_end(data, whole) == whole


operations = st.lists(
    st.tuples(st.sampled_from(["request", "group", "owner", "commit", "sync"]), st.integers(1, 4)),
    max_size=30,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_property_the_copy_is_a_verified_prefix_at_every_step(ops: list[tuple[str, int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        owner_home, root = Path(tmp, "owner"), Path(tmp, "replicas")
        token = 1
        with Session.create(owner_home, "s", BASELINE) as owner:
            replica = _sync(owner_home, root, None, token)
            for n, (op, size) in enumerate(ops):
                if op == "request":
                    _request(owner, n, tool=size % 2 == 0)
                elif op == "group":
                    _request(owner, n, size=size + 1)
                elif op == "owner":
                    token += size
                    owner.append(Owner(node="a", token=token))
                elif op == "commit":
                    owner.commit_epoch(f"e{n}", BASELINE)
                else:
                    steps = steps_after(owner_home, "s", replica.position, token)
                    for step in steps:
                        for piece in split_step(step, 200 * size):
                            replica.apply(piece)
                            _check_copy(str(owner_home / "sessions" / "s"), replica.dir, "s")
            replica = _sync(owner_home, root, replica, token)
            replica.close()
        assert _files(session_dir(root, "s")) == _files(str(owner_home / "sessions" / "s"))


def _copy_bytes(directory: Path) -> int:
    if not directory.is_dir():
        return 0
    return sum(p.stat().st_size for p in directory.glob("*.jsonl"))


def test_sigkill_of_a_process_applying_groups_leaves_a_verified_prefix(tmp_path: Path) -> None:
    owner_home, root = tmp_path / "owner", tmp_path / "replicas"
    with Session.create(owner_home, "s", BASELINE) as owner:
        owner.append(Owner(node="a", token=1))
        for n in range(600):
            _request(owner, n, tool=n % 3 == 0, size=1 + n % 4)
            if n % 150 == 149:
                owner.commit_epoch(f"e{n}", BASELINE)
    owner_dir = owner_home / "sessions" / "s"
    copy_dir = root / "sessions" / "s"
    total = _copy_bytes(owner_dir)
    command = [sys.executable, "-m", "tests.replica_applier", str(owner_home), str(root), "s"]
    seen = 0
    for fraction in (0.05, 0.3, 0.55, 0.8):
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        try:
            poll_until(lambda f=fraction: _copy_bytes(copy_dir) >= f * total,  # type: ignore[misc]
                       timeout=60, what=f"the copy past {fraction:.0%}")  # fmt: skip
            child.send_signal(signal.SIGKILL)
        finally:
            child.kill()
            child.wait()
        assert child.returncode == -signal.SIGKILL
        with Replica.open(root, "s") as replica:  # a torn last group is quarantined
            at = replica.position
        _check_copy(str(owner_dir), str(copy_dir), "s")
        size = _copy_bytes(copy_dir)
        assert size > seen  # it made progress, and kept it
        seen = size
        assert (at.epoch, at.size) <= (owner.epoch, total)
    done = subprocess.run(command, capture_output=True, timeout=60, check=True)
    assert done.stdout.strip().decode() == str(copy_dir / f"{owner.epoch}.jsonl")
    assert _files(str(copy_dir)) == _files(str(owner_dir))


def test_a_torn_last_group_of_the_copy_goes_to_quarantine_at_open(tmp_path: Path) -> None:
    owner_home, root = tmp_path / "owner", tmp_path / "replicas"
    _owner_with_groups(owner_home, 2)
    first, rest = steps_after(owner_home, "s", None, 5)
    owner_line, g1, g2 = split_step(rest, 1)
    with Replica.create(root, first) as replica:
        replica.apply(owner_line)
        replica.apply(g1)
        log = Path(replica.dir, "0.jsonl")
    held = log.read_bytes()
    torn = g2.data[: g2.data.index(b"\n") + 5]  # what a kill inside the write leaves
    log.write_bytes(held + torn)
    with Replica.open(root, "s") as replica:
        assert replica.repaired is not None
        assert Path(replica.repaired.quarantine).read_bytes() == torn
        assert log.read_bytes() == held
        replica.apply(g2)
    _check_copy(str(owner_home / "sessions" / "s"), session_dir(root, "s"), "s")
