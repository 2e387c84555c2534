"""A send over HTTP rides a connection to the session's worker kept open by the port
(supervisor/http/worker_links.py): a worker's death, between two sends or with one in
flight, is answered as ``Client.send`` answers it, each request applied once."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import psutil

from tests.harness.etcd_server import free_port
from tests.harness.http_client import Api
from tests.harness.support import log_user_keys, poll_until, running_daemon, status


def _pid(home: Path) -> int:
    pid = status(home, "s")["pid"]
    assert isinstance(pid, int)
    return pid


def _killed(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    poll_until(lambda: not psutil.pid_exists(pid), what=f"worker {pid} to be reaped")


def test_a_send_after_the_worker_of_its_kept_connection_was_sigkilled_is_applied_once(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    port = free_port()
    with running_daemon(home, "--http", f"127.0.0.1:{port}"):
        api = Api(port)
        assert api.ask("POST", "/v1/sessions", {"id": "s"})[0] == 201
        status_code, first = api.ask("POST", "/v1/sessions/s/requests", {"text": "a"},
                                     {"Idempotency-Key": "a"})  # fmt: skip
        assert (status_code, first["duplicate"]) == (200, False)
        _killed(_pid(home))  # the port's connection to it ends here, between two sends
        status_code, second = api.ask("POST", "/v1/sessions/s/requests", {"text": "b"},
                                      {"Idempotency-Key": "b"})  # fmt: skip
        assert (status_code, second["duplicate"], second["text"]) == (200, False, "echo: b")
        status_code, again = api.ask("POST", "/v1/sessions/s/requests", {"text": "b"},
                                     {"Idempotency-Key": "b"})  # fmt: skip
        assert (status_code, again["duplicate"]) == (200, True)
        assert status(home, "s")["restarts"] == 1
        api.conn.close()
    assert log_user_keys(home, "s") == ["a", "b"]


def test_a_send_in_flight_when_its_worker_is_sigkilled_is_answered_from_the_log_once(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    port = free_port()
    with running_daemon(home, "--http", f"127.0.0.1:{port}", "--app", "tests.apps:BlockingApp"):
        api = Api(port)
        assert api.ask("POST", "/v1/sessions", {"id": "s"})[0] == 201
        assert api.ask("POST", "/v1/sessions/s/requests", {"text": "warm"},
                       {"Idempotency-Key": "warm"})[0] == 200  # fmt: skip
        answers: list[tuple[int, dict[str, object]]] = []

        def send() -> None:
            other = Api(port)
            answers.append(other.ask("POST", "/v1/sessions/s/requests", {"text": "block-after"},
                                     {"Idempotency-Key": "once"}))  # fmt: skip
            other.conn.close()

        sender = threading.Thread(target=send)
        sender.start()
        marker = poll_until(
            lambda: next(iter(home.glob("blocked-*")), None), what="the worker to hold it"
        )
        _killed(int(marker.name.split("-")[1]))  # applied, unanswered, on the kept connection
        sender.join(timeout=30)
        assert not sender.is_alive()
        [(status_code, reply)] = answers
        assert (status_code, reply["duplicate"], reply["key"]) == (200, True, "once")
        assert status(home, "s")["restarts"] == 1
        api.conn.close()
    assert log_user_keys(home, "s") == ["warm", "once"]
