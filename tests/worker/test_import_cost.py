"""What an interpreter loads to start: no codec compiled before a record is read, and a
client or a CLI command loads neither the chaos rig, the daemon nor the whole store.

Structure only: the import times themselves are figures of scripts/supervisor/bench_imports.py
(docs/benchmarks.md), never assertions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.harness.support import REPO

_LOADED = """
import json, sys
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in
                        ("worker", "supervisor", "chaos", "hypothesis", "psycopg"))))
"""
_CLI = """
import sys
sys.argv = ["loopd", *{args!r}]
from supervisor.cli import main
try:
    main()
except SystemExit:
    pass
"""


def _loaded_by(code: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", code + _LOADED],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    loaded: set[str] = set(json.loads(done.stdout.splitlines()[-1]))
    return loaded


def _under(loaded: set[str], *packages: str) -> list[str]:
    return sorted(m for m in loaded if any(m == p or m.startswith(p + ".") for p in packages))


def test_importing_the_store_compiles_no_codec_until_a_line_of_its_type_is_read() -> None:
    code = """
from worker import Session
from worker.store.format.record_codecs import DECODERS, ENCODERS
from worker.store.format.records import User, decode_record, encode_record
def compiled():
    return sorted(name for name, f in {**DECODERS, **ENCODERS}.items()
                  if f.__code__.co_filename.startswith("<codec "))
print(compiled())
line = encode_record(User(text="hi")).rstrip(b"\\n")
assert decode_record(line) == User(time=decode_record(line).time, text="hi")
print(compiled())
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
        check=True,
    )  # fmt: skip
    assert done.stdout.splitlines() == ["[]", "['User']"]


@pytest.mark.parametrize(
    "code",
    [
        "from supervisor.client import Client, call",
        _CLI.format(args=["status", "--home", "/nonexistent-loopd-home"]),
        _CLI.format(args=["send", "--help"]),
    ],
    ids=["client", "loopd-status", "loopd-send-help"],
)
def test_a_client_or_a_command_loads_neither_the_rig_the_daemon_nor_the_store(
    code: str,
) -> None:
    loaded = _loaded_by(code)
    assert _under(loaded, "chaos", "supervisor.daemon", "hypothesis", "psycopg") == []
    # the errors the wire format raises, and the session-id check the --cluster parser uses
    assert {*_under(loaded, "worker.store")} <= {
        "worker.store",
        "worker.store.errors",
        "worker.store.session_id",
    }
    # the cluster's errors, which a command catches; its transport (ssl) only with a
    # TLS option or --cluster
    assert _under(loaded, "supervisor.cluster") in (
        [],
        ["supervisor.cluster", "supervisor.cluster.errors"],
    )


@pytest.mark.parametrize(
    ("args", "ssl"),
    [
        (["status", "--home", "/nonexistent-loopd-home"], False),
        (["status", "--cluster", "http://127.0.0.1:9"], True),
        # the TLS files are for the cluster's nodes: a home's socket needs no ssl
        (["status", "--home", "/nonexistent-loopd-home", "--tls-ca", "/nonexistent.pem"], False),
    ],
    ids=["home", "cluster", "home-with-a-tls-option"],
)
def test_a_command_loads_ssl_only_to_reach_a_cluster(args: list[str], ssl: bool) -> None:
    code = _CLI.format(args=args) + "\nprint('ssl' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**os.environ, "LOOPD_TIMEOUT": "0.2"}, check=True,
    )  # fmt: skip
    assert done.stdout.splitlines()[-1] == str(ssl), done.stderr


def test_importing_worker_for_the_wire_format_loads_the_store_only_when_asked() -> None:
    loaded = _loaded_by("import worker.ipc.wire")
    assert _under(loaded, "worker") == [
        "worker",
        "worker.ipc",  # its package: a docstring only
        "worker.ipc.wire",
        "worker.store",
        "worker.store.errors",
    ]
    assert "worker.store.session" in _loaded_by("import worker\nworker.Session")


def test_importing_the_store_loads_no_cold_path_salvage_plan_socket_or_calendar() -> None:
    code = (
        "import json, sys\nfrom worker import Session\nSession.open\n"
        "print(json.dumps(sorted(m for m in sys.modules if m in"
        " ('socket', 'selectors', 'calendar', 'worker.offline.salvage_plan',"
        " 'worker.store.unfinished_salvage'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
        check=True,
    )  # fmt: skip
    # open's check for a salvage plan is loaded; the plan, socket and calendar on first use
    assert json.loads(done.stdout) == ["worker.store.unfinished_salvage"]


_AFTER_WARM_UP = """
import json, shutil, sys, tempfile
from worker.warm_up import warm_up
warm_up(requests=2)
before = set(sys.modules)
from worker import Baseline, Session, User
from worker.store.format.records import Schedule
from worker.store.schedules import format_time, parse_time
# mkdtemp, not TemporaryDirectory: its weakref.finalize imports atexit, the test's own
home = tempfile.mkdtemp()
try:
    baseline = Baseline(system="s", memory="m")
    session = Session.create(home, "s", baseline)
    session.append(User(text="hi", key="k1"))
    session.append(Schedule(key="later", at=format_time(0.0), text="later"))
    assert parse_time(format_time(0.0)) == 0.0
    session.commit_epoch("summary", baseline)
    session.append(User(text="again", key="k2"))
    session.close()
    Session.open(home, "s").close()
finally:
    shutil.rmtree(home)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_after_the_warm_up_a_schedule_an_epoch_commit_and_an_open_import_nothing() -> None:
    # A forked worker shares what the daemon imported before the fork (worker/warm_up.py):
    # what the store imports on first use must be imported by the warm-up too.
    done = subprocess.run(
        [sys.executable, "-c", _AFTER_WARM_UP], cwd=REPO, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    assert json.loads(done.stdout.splitlines()[-1]) == []
