"""A full disk is an outage, not a session's fault: started again until space is freed.

A real full filesystem (a tmpfs of 4 MiB, filled by a file): a session whose epoch
change was interrupted must write its next epoch's files to open. While the disk is
full its worker exits 9 (``disk_full``) and is started again, past ``--start-retries``,
never FATAL, ``last_error`` saying what it waits for; once the file is removed it opens
by itself, with every request acknowledged before. Mounting needs root (CI is root).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from supervisor.client import Client
from supervisor.hosting.daemon_output import DaemonOutput
from tests.harness.support import loopd, poll_until, running_daemon, status, wait_state
from worker import EpochEnd, Session, User
from worker.app import DefaultApp
from worker.store.errors import SessionIOError
from worker.store.format.records import encode_appended

MOUNT: Final = shutil.which("mount") or "/usr/bin/mount"
UMOUNT: Final = shutil.which("umount") or "/usr/bin/umount"
pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root"),
]


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of 4 MiB mounted for the test, unmounted after it."""
    mount = tmp_path / "fs"
    mount.mkdir()
    subprocess.run([MOUNT, "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run([UMOUNT, "-l", str(mount)], check=False)


def _fill(path: Path) -> None:
    """Write ``path`` until the filesystem has no room left."""
    with path.open("wb", buffering=0) as filler:
        for size in (65536, 512):  # then the last pages, a smaller write at a time
            failure = None
            while failure is None:
                try:
                    filler.write(b"\0" * size)
                except OSError as exc:
                    failure = exc.errno
            assert failure == errno.ENOSPC, os.strerror(failure)


def test_a_full_disk_restarts_the_session_until_space_is_freed_never_fatal(
    small_fs: Path,
) -> None:
    home = small_fs / "home"
    with Session.create(home, "s", DefaultApp().initial_baseline("s")) as session:
        session.append_many([User(text=f"r{n}", untrusted=False, key=f"k{n}") for n in range(3)])
        log = Path(session.dir) / "0.jsonl"
    # An epoch change interrupted after its EpochEnd: opening completes it (epoch 1).
    with log.open("ab") as f:
        f.write(encode_appended(log.read_bytes(), EpochEnd(next=1, summary="s")))
    filler = small_fs / "filler"
    _fill(filler)
    with running_daemon(home, "--start-retries", "2", "--max-restarts", "2"):

        def waiting() -> dict[str, object] | None:
            row = status(home, "s")
            assert row["state"] != "FATAL", row["last_error"]
            full = "is full: started again until space is freed" in str(row["last_error"])
            return row if full and int(str(row["restarts"])) > 4 else None

        row = poll_until(waiting, timeout=60, what="restarts past --start-retries, not FATAL")
        assert "[ENOSPC]" in str(row["last_error"])
        refused = loopd("send", "--home", str(home), "--timeout", "1", "s", "x", "--key", "k5")
        assert refused.returncode != 0
        assert "not acknowledged: send it again with --key k5" in refused.stderr
        filler.unlink()
        wait_state(home, "s", "RUNNING", epoch=1)
        with Client(str(home)) as client:
            again = client.send("s", "r0", key="k0")
            assert (again["duplicate"], again["epoch"]) == (True, 0)  # acknowledged before
            assert client.send("s", "new", key="k9")["duplicate"] is False
    verified = loopd("verify", "--home", str(home))
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_serves_output_never_raises_on_a_full_device_and_counts_what_it_dropped() -> None:
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        output = DaemonOutput(None, fd)
        output.line("one")
        output.line("two")  # ENOSPC each time: dropped and counted, never raised
        assert output.dropped == 2
        output.close()
    finally:
        os.close(fd)


def test_serves_output_to_a_full_file_drops_whole_lines_and_says_how_many_later(
    small_fs: Path,
) -> None:
    log = small_fs / "serve.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        output = DaemonOutput(None, fd)
        output.line("before")
        _fill(small_fs / "filler")
        for n in range(3):
            output.line(f"lost {n} " + "x" * 5000)  # past the last page: cut, then refused
        (small_fs / "filler").unlink()
        output.line("after")
        output.close()
    finally:
        os.close(fd)
    lines = log.read_text().splitlines()
    assert lines[0] == "before"
    assert lines[-1] == "after"
    assert lines[-2].startswith("loopd serve: "), lines[-2][:80]  # the count, on its own line
    assert "lines dropped: this output could not be written" in lines[-2]


def test_an_enospc_outside_the_home_is_not_the_homes_full_disk(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert SessionIOError(str(home / "sessions" / "s" / "1.jsonl"), errno.ENOSPC, "write").fills(
        str(home)
    )
    assert not SessionIOError("/app/scratch", errno.ENOSPC, "write").fills(str(home))
    assert not SessionIOError(str(home / "x"), errno.EIO, "write").fills(str(home))


def test_a_stop_is_done_when_it_cannot_be_kept_and_status_says_so(tmp_path: Path) -> None:
    """intent.json cannot be written (a full disk; here a directory where its temporary
    file goes): a stop is still done, for the session may be what fills the disk, and
    status says a restart of serve would start it again (as a start does: the intent still
    says it runs, so nothing needs writing)."""
    home = tmp_path / "home"
    with running_daemon(home):
        assert loopd("create", "--home", str(home), "s").returncode == 0
        (home / "intent.json.tmp").mkdir()  # every write of intent.json fails from now on
        done = loopd("stop", "--home", str(home), "s")
        assert done.returncode == 0, done.stderr
        row = wait_state(home, "s", "STOPPED")
        assert "stopped, but not kept across a restart of serve" in str(row["last_error"])
        assert loopd("start", "--home", str(home), "s").returncode == 0
        assert wait_state(home, "s", "RUNNING")["last_error"] is None
