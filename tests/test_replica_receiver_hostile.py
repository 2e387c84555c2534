"""A follower's receiver under a buggy or hostile peer, and a replicas home tampered with.

Each test drives ``ReplicaReceiver.handle`` (what the node's TLS gateway calls for a
node certificate's ``replicate`` and ``replica_position``) on real files: every refusal
is one line, nothing waits forever, a refused open leaves no lock behind, and a step
resent after its acknowledgement was lost is answered as held, whatever its epoch.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from supervisor.cluster.replica_receiver import ReplicaReceiver
from tests.test_store_replica import BASELINE, _request
from worker import Owner, Session
from worker.store.replica_source import split_step, steps_after
from worker.store.replica_types import Step
from worker.wire import Message

pytestmark = pytest.mark.timeout(60)


def _steps(owner_home: Path, *, epochs: int = 1) -> list[Step]:
    """The owner's log as the steps it ships: one a group, epochs committed between."""
    with Session.create(owner_home, "s", BASELINE) as owner:
        owner.append(Owner(node="a", token=5))
        for epoch in range(epochs):
            if epoch:
                owner.commit_epoch(f"summary {epoch}", BASELINE)
            for n in range(2):
                _request(owner, 10 * epoch + n, size=2)
    steps: list[Step] = []
    for step in steps_after(owner_home, "s", None, 5):
        steps += [step] if step.is_epoch else split_step(step, 1)
    return steps


def _replicate(receiver: ReplicaReceiver, step: Step) -> Message:
    return receiver.handle({"id": 1, "op": "replicate", "step": step.to_message()})


def _position(receiver: ReplicaReceiver) -> Message:
    return receiver.handle({"id": 2, "op": "replica_position", "session": "s"})


def _one_line_error(reply: Message) -> str:
    assert reply.get("ok") is False, reply
    failure = reply.get("error")
    assert isinstance(failure, dict), reply
    message = str(failure.get("message"))
    assert "\n" not in message
    return f"{failure.get('code')}: {message}"


@pytest.fixture
def copy(tmp_path: Path) -> tuple[Path, list[Step]]:
    """A follower home whose copy of ``s`` holds the owner's first step, closed."""
    steps = _steps(tmp_path / "owner")
    receiver = ReplicaReceiver(str(tmp_path / "follower"))
    assert _replicate(receiver, steps[0])["ok"] is True
    receiver.close()
    return tmp_path / "follower" / "replicas", steps


def test_a_fifo_at_the_copys_fence_is_refused_not_waited_on(
    copy: tuple[Path, list[Step]],
) -> None:
    root, _ = copy
    fence = root / "fences" / "s"
    fence.unlink()  # the owner's token, written at the copy's creation
    os.mkfifo(fence)
    receiver = ReplicaReceiver(str(root.parent))
    replies: list[Message] = []
    asking = threading.Thread(target=lambda: replies.append(_position(receiver)), daemon=True)
    asking.start()
    asking.join(10)
    try:
        assert not asking.is_alive(), "the receiver waits for a writer of the FIFO"
    finally:
        if asking.is_alive():  # let the old code's blocked open end
            os.close(os.open(fence, os.O_WRONLY | os.O_NONBLOCK))
            asking.join(10)
        receiver.close()
    assert "fences/s: is not a regular file" in _one_line_error(replies[0])


def test_a_refused_fence_leaves_the_copy_unlocked(copy: tuple[Path, list[Step]]) -> None:
    """A copy whose open failed is not left locked by the receiver's own process: the next
    request is refused for the same reason, and once the file is mended the copy opens."""
    root, steps = copy
    fence = root / "fences" / "s"
    fence.write_bytes(b"12\nnot a token")
    receiver = ReplicaReceiver(str(root.parent))
    try:
        for _ in range(2):
            problem = _one_line_error(_replicate(receiver, steps[1]))
            assert "not a token" in problem, problem
        fence.write_bytes(b"5\n")
        reply = _replicate(receiver, steps[1])
        assert reply["ok"] is True, reply
    finally:
        receiver.close()


def test_a_file_in_place_of_the_copy_is_named_not_taken_for_no_copy(
    copy: tuple[Path, list[Step]],
) -> None:
    root, steps = copy
    directory = root / "sessions" / "s"
    shutil.rmtree(directory)
    directory.write_bytes(b"not a copy")
    receiver = ReplicaReceiver(str(root.parent))
    try:
        for reply in (_position(receiver), _replicate(receiver, steps[0])):
            assert "sessions/s: is not a directory" in _one_line_error(reply)
    finally:
        receiver.close()
    assert directory.read_bytes() == b"not a copy"


def test_a_replicas_home_that_is_a_file_is_one_line_not_an_exception(tmp_path: Path) -> None:
    steps = _steps(tmp_path / "owner")
    home = tmp_path / "follower"
    home.mkdir()
    (home / "replicas").write_bytes(b"x")
    receiver = ReplicaReceiver(str(home))
    try:
        problem = _one_line_error(_replicate(receiver, steps[0]))
    finally:
        receiver.close()
    assert problem.startswith("replica_failed: "), problem
    assert "replicas" in problem, problem


def test_every_step_resent_is_held_once_the_copy_is_at_a_later_epoch(tmp_path: Path) -> None:
    """Idempotence: each step sent again (a lost acknowledgement) is answered with the
    copy's position and changes nothing, also the lines of an epoch sealed since."""
    steps = _steps(tmp_path / "owner", epochs=2)
    assert any(s.epoch == 0 and not s.is_epoch for s in steps)
    receiver = ReplicaReceiver(str(tmp_path / "follower"))
    copy = tmp_path / "follower" / "replicas" / "sessions" / "s"
    try:
        for step in steps:
            assert _replicate(receiver, step)["ok"] is True
        at = _position(receiver)["result"]
        files = {p.name: p.read_bytes() for p in copy.iterdir()}
        for step in steps:
            reply = _replicate(receiver, step)
            assert reply["ok"] is True, (step.describe(), reply)
            assert reply["result"] == at
        assert {p.name: p.read_bytes() for p in copy.iterdir()} == files
    finally:
        receiver.close()
