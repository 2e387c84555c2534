"""Bad input to any command is one line naming what was wrong, never a traceback; every
float option refuses nan and inf; every setting is bounded; and the log tells a worker's
real end, even when its restart is immediate."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.client import call
from tests.harness.support import REPO, loopd, poll_until, running_daemon, status, wait_state

SERVE_FLOATS = (
    "--restart-window", "--backoff-base", "--backoff-max", "--stable-after", "--hang-timeout",
    "--request-deadline", "--idle-stop", "--rss-check-interval",
)  # fmt: skip


def _refused_in_one_line(done: subprocess.CompletedProcess[str], said: str) -> None:
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert re.search(said, done.stderr), done.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "1e308", "-inf"])
def test_a_timeout_from_the_environment_that_is_not_a_sane_number_is_refused(
    tmp_path: Path, value: str
) -> None:
    done = loopd("status", "--home", str(tmp_path), env={"LOOPD_TIMEOUT": value})
    _refused_in_one_line(done, r"--timeout.*(not a finite number|not in the range)")


@pytest.mark.parametrize("command", [("status",), ("send", "s", "x"), ("create", "s"),
                                     ("stop", "s"), ("events",), ("metrics",)])  # fmt: skip
def test_a_home_of_5000_characters_is_refused_in_one_line(command: tuple[str, ...]) -> None:
    home = "/tmp/" + "h" * 5000
    done = loopd(*command, env={"LOOPD_HOME": home})
    _refused_in_one_line(done, r"over the 107-byte limit|File name too long")
    assert len(done.stderr) < 1000  # the path is shown cut, not 5,000 characters long


def test_serve_with_a_home_of_5000_characters_is_refused_in_one_line() -> None:
    done = loopd("serve", env={"LOOPD_HOME": "/tmp/" + "h" * 5000})
    _refused_in_one_line(done, r"File name too long")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("logs", "s", "-n", "99999999999999999999"), r"'-n' / '--lines'.*not in the range"),
        (("create", "s", "--slot", str(10**23)), r"'--slot'.*not in the range"),
        (("status", "--cluster", "ftp://x"), r"must be http://host:port, got 'ftp://x'"),
        (("send", "--cluster", "ftp://x", "s", "x"), r"must be http://host:port, got 'ftp://x'"),
        (("status", "--cluster", "http://[::1"), r"got 'http://\[::1'.*Invalid IPv6 URL"),
        (("create", "--cluster", "http://[::1", "s"), r"Invalid IPv6 URL"),
        (("move", "--cluster", "ftp://x", "s", "--to", "n"), r"must be http://host:port, got 'ftp://x'"),
        (("serve", "--cluster", "http://[::1", "--node", "n"), r"Invalid IPv6 URL"),
    ],
    ids=["logs-n", "create-slot", "status-ftp", "send-ftp", "status-ipv6", "create-ipv6",
         "move-ftp", "serve-ipv6"],
)  # fmt: skip
def test_an_out_of_range_number_or_a_bad_cluster_url_is_refused_in_one_line(
    tmp_path: Path, args: tuple[str, ...], said: str
) -> None:
    # --home and --cluster are exclusive: only the commands without --cluster get a home.
    env = {} if "--cluster" in args else {"LOOPD_HOME": str(tmp_path / "home")}
    done = loopd(*args, env=env)
    _refused_in_one_line(done, said)
    assert done.returncode == 2


def test_text_that_is_not_utf8_is_refused_in_one_line_before_it_is_sent(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home):
        call(str(home), "create", session="s")
        cases: list[list[str | bytes]] = [
            ["send", "--home", str(home), "s", b"caf\xe9"],  # a Latin-1 byte: a lone surrogate
            ["send", "--home", str(home), "s", "ok", "--key", b"\xff"],
            ["status", "--home", str(home), b"\xff"],
            ["stop", "--home", str(home), b"s\xff"],
        ]
        for argv in cases:
            done = subprocess.run(
                [sys.executable, "-m", "supervisor", *argv], capture_output=True, text=True,
                timeout=60, check=False, cwd=REPO,
            )  # fmt: skip
            _refused_in_one_line(done, r"lone surrogate, not UTF-8 text")
        assert status(home, "s")["state"] == "RUNNING"


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("option", SERVE_FLOATS)
def test_every_float_option_of_serve_refuses_nan_and_inf_as_a_flag(
    tmp_path: Path, option: str, value: str
) -> None:
    done = loopd("serve", "--home", str(tmp_path / "home"), option, value, "--print-config")
    _refused_in_one_line(done, rf"'{option}': '{value}' is not a finite number")


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("hang-timeout = nan", r"key 'hang-timeout': nan is not a finite number"),
        ("hang-timeout = inf", r"key 'hang-timeout': inf is not a finite number"),
        ("backoff-max = -inf", r"key 'backoff-max': -inf is not a finite number"),
        ("idle-stop = nan", r"key 'idle-stop': nan is not a finite number"),
        ("log-backups = 3000000", r"key 'log-backups': 3000000 is not in the range 0<=x<=1000"),
        ("max-live = 1000000000", r"key 'max-live': .* is not in the range"),
        ("log-max-bytes = 100000000000", r"key 'log-max-bytes': .* is not in the range"),
        ("max-restarts = -1", r"key 'max-restarts': -1 is not in the range"),
        ("hang-timeout = 1e9", r"key 'hang-timeout': .* is not in the range"),
        ('cluster = "ftp://x"', r"key 'cluster': etcd URL must be http://host:port, got 'ftp://x'"),
    ],
)
def test_loopd_toml_values_out_of_range_or_not_finite_are_refused_naming_the_key(
    tmp_path: Path, line: str, said: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "loopd.toml").write_text(line + "\n")
    done = loopd("serve", "--home", str(home), "--print-config")
    _refused_in_one_line(done, r"loopd\.toml: " + said)
    assert done.returncode == 1


def test_a_sigkilled_worker_restarted_at_once_is_logged_as_killed_not_as_exited_0(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home):
        call(str(home), "create", session="s")
        pid = status(home, "s")["pid"]
        assert isinstance(pid, int)
        os.kill(pid, signal.SIGKILL)  # the first crash after a stable run: restarted at once
        poll_until(lambda: status(home, "s")["pid"] not in (None, pid), what="the restart")
        wait_state(home, "s", "RUNNING")
        log = home / "logs" / "s.log"
        poll_until(lambda: re.search(rf"worker {pid} (killed|exited)", log.read_text()),
                   what="the exit to be logged")  # fmt: skip
        shown = loopd("logs", "--home", str(home), "s", "-n", "100")
    assert shown.returncode == 0
    assert f"[loopd] worker {pid} killed by signal 9" in shown.stdout
    assert f"worker {pid} exited with code 0" not in shown.stdout


_NO_TLS_ENV = {"LOOPD_TLS_CA": "", "LOOPD_TLS_CERT": "", "LOOPD_TLS_KEY": ""}
CLUSTER_COMMANDS = {
    "move": ("move", "s", "--to", "n2"),
    "move-abort": ("move", "s", "--abort"),
    "drain": ("drain", "n1"),
    "cordon": ("cordon", "n1"),
    "uncordon": ("uncordon", "n1"),
    "takeover": ("takeover", "s", "--from-copy", ".", "--to", "n2"),
    "status": ("status",),
    "send": ("send", "s", "x"),
    "create": ("create", "s"),
}


@pytest.mark.parametrize("command", CLUSTER_COMMANDS.values(), ids=CLUSTER_COMMANDS.keys())
def test_a_cluster_command_at_an_https_etcd_with_no_certificate_names_the_missing_options(
    command: tuple[str, ...],
) -> None:
    done = loopd(*command, "--cluster", "https://127.0.0.1:1", env=_NO_TLS_ENV)
    said = (r"--tls-ca \(\$LOOPD_TLS_CA\), --tls-cert \(\$LOOPD_TLS_CERT\), "
            r"--tls-key \(\$LOOPD_TLS_KEY\)")  # fmt: skip
    _refused_in_one_line(
        done, r"--cluster https://127\.0\.0\.1:1 is https: .*" + said + " not given"
    )
    assert done.returncode == 2


def test_a_cluster_command_at_an_https_etcd_with_one_certificate_names_the_other_two(
    tmp_path: Path,
) -> None:
    done = loopd("cordon", "n1", "--cluster", "https://127.0.0.1:1",
                 "--tls-ca", str(tmp_path / "ca.pem"), env=_NO_TLS_ENV)  # fmt: skip
    _refused_in_one_line(done, r"--tls-cert, --tls-key not given")
    assert done.returncode == 2
