"""A ``not_owner`` after the fsync is no refusal: the request may be durable.

A cluster worker checks its node's lease before it writes and again before it replies.
If the lease lapsed in between (here: at the fsync of the group commit, in a real
worker process), the request is on disk but the reply is ``not_owner``; the client
reports it ``unanswered`` (outcome unknown), and the retry by key at the next owner is
answered ``duplicate``. A ``not_owner`` checked before writing says so
(``before_write``) and stays ``refused``: it is not in the log.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from supervisor.client.direct import Client, Request
from tests.harness.support import REPO, log_user_keys
from worker import Session
from worker.app import DefaultApp
from worker.ipc.lease_deadline import write_deadline
from worker.ipc.wire import Channel, encode

SESSION = "s1"


def _publish(path: Path, lease: int) -> None:
    """The node's lease file: ``lease`` proven for an hour."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        write_deadline(fd, time.monotonic() + 3600, str(path), lease)
    finally:
        os.close(fd)


def lapsed_why(lease_file: Path) -> str:
    return f"{lease_file}: not the owner now: lease 10 is not proven within its renew deadline"


class _Attached(Client):
    """The real client; its connection is handed to the worker as the daemon hands it."""

    def __init__(self, control: Channel) -> None:
        super().__init__(os.devnull, timeout=30.0, retry_for=5.0)
        self.control = control

    def _connect(self, session: str) -> socket.socket:
        del session
        client_end, worker_end = socket.socketpair()
        try:
            socket.send_fds(self.control.sock, [encode({"op": "attach"})], [worker_end.fileno()])
        finally:
            worker_end.close()
        return client_end


@contextmanager
def _cluster_worker(
    home: Path, lease_file: Path, arm: Path, *, node: str, token: int, lease: int
) -> Iterator[_Attached]:
    """A real worker process of ``SESSION`` in cluster mode; a client attached to it."""
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.programs.lease_lapsing_worker", "--home", str(home),
         "--session", SESSION, "--channel-fd", str(theirs.fileno()),
         "--cluster-node", node, "--cluster-token", str(token),
         "--cluster-lease", str(lease), "--lease-file", str(lease_file)],
        pass_fds=(theirs.fileno(),),
        cwd=REPO,
        env={**os.environ, "LOOPD_TEST_LAPSE_ARM": str(arm)},
        stderr=subprocess.PIPE,
    )  # fmt: skip
    theirs.close()
    control = Channel(ours)
    client = _Attached(control)
    try:
        ready = control.recv()
        assert ready is not None, "the worker ended before it was ready"
        assert ready.get("op") == "ready", ready
        yield client
    finally:
        client.close()
        with contextlib.suppress(OSError):
            control.send({"id": 0, "op": "stop"})
        ours.close()
        try:
            proc.wait(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()


def test_a_not_owner_after_the_fsync_is_unanswered_and_the_retry_by_key_a_duplicate(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    Session.create(home, SESSION, DefaultApp().initial_baseline(SESSION)).close()
    lease_file, arm = tmp_path / "cluster.lease", tmp_path / "arm"
    _publish(lease_file, 0x10)
    with _cluster_worker(home, lease_file, arm, node="a", token=5, lease=0x10) as client:
        [applied] = client.send_many(SESSION, [Request(text="first", key="k0")])
        assert applied["outcome"] == "applied"
        arm.touch()  # the lease lapses at the next fsync: k1's group commit
        [lapsed] = client.send_many(SESSION, [Request(text="second", key="k1")])
        assert not arm.exists()
        assert lapsed["outcome"] == "unanswered", lapsed
        assert lapsed["error"] == {"code": "not_owner", "message": lapsed_why(lease_file)}
        assert "k1" in log_user_keys(home, SESSION)  # durable: "refused" would be a lie
        # The lease is still lapsed: checked before the write, refused, and not applied.
        [before] = client.send_many(SESSION, [Request(text="third", key="k2")])
        assert before["outcome"] == "refused", before
        assert before["error"] == {"code": "not_owner", "message": lapsed_why(lease_file)}
        assert "k2" not in log_user_keys(home, SESSION)
    # The next owner (a new lease, a higher token): the retries by key.
    _publish(lease_file, 0x11)
    with _cluster_worker(home, lease_file, arm, node="b", token=6, lease=0x11) as client:
        retried = client.send_many(
            SESSION, [Request(text="second", key="k1"), Request(text="third", key="k2")]
        )
        assert [r["outcome"] for r in retried] == ["duplicate", "applied"], retried
        assert retried[0]["token"] == 6
    assert log_user_keys(home, SESSION) == ["k0", "k1", "k2"]
