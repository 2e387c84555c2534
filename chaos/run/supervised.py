"""Supervisor-level chaos: a real ``loopd serve`` under request load while workers die.

Workers are SIGKILLed at random moments (chosen with psutil, identity checked) and, from
inside, at random write boundaries (the ChaosApp installs a boundary hook in each worker
it is loaded into). Clients retry with their keys. At the end every acknowledged request
must be in its session's log exactly once, and every session must verify.

Each violation names its invariant (``invariant: what``): ``acknowledged-in-log``,
``applied-once``, ``session-verifies``, ``no-worker-outlives-serve``, and
``workers-share-no-descriptor`` (chaos/run/shared_descriptors.py).

The boundary kills are drawn from the run's seed, the session and the worker's
incarnation (the how-many-th worker of that session it is), never from a pid, so the
same seed replays the same schedule of boundary kills. The outside killer draws its
choices from the seed too; when they land depends on timing.

With a PostgreSQL store (``--store URI``) the boundaries are each fenced write's two
points (``worker.store.postgres.boundaries``: before its COMMIT, the transaction open,
and after it, the caller not yet told); a worker there does not know its session at
its hook, so its kills are drawn from the seed and its rank among the run's workers
(the n-th to reach a COMMIT), which a replay repeats as far as the workers' order does.
The logs are then read from the database.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import psutil

from chaos.lifeline import die_with_parent
from chaos.run.shared_descriptors import look_for_shared
from supervisor.client import Client, call, call_with_retry
from supervisor.control_socket import SOCKET_NAME
from supervisor.errors import ControlError
from supervisor.templates.spare import SPARE_NAMES
from worker.app import App, DefaultApp, load_app
from worker.store.disk import durable
from worker.store.disk.durable import Boundary
from worker.store.disk.layout import SESSIONS_DIR, session_dir
from worker.store.errors import SessionError
from worker.store.format.records import Record, User
from worker.store.loader import load_session
from worker.store.postgres import boundaries
from worker.store.postgres.boundaries import Point

SEED_ENV: Final = "LOOPD_CHAOS_SEED"
PROBABILITY_ENV: Final = "LOOPD_CHAOS_KILL_PROBABILITY"
APP_ENV: Final = "LOOPD_CHAOS_APP"  # the user's App the chaos workers host
SCHEDULE_ENV: Final = "LOOPD_CHAOS_SCHEDULE_DIR"  # where workers count their incarnations
STORE_ENV: Final = "LOOPD_CHAOS_STORE"  # set: the sessions are in this PostgreSQL store


class _RandomKill:
    """A boundary hook that SIGKILLs its own process at a random boundary.

    Its random stream starts at the first boundary inside a session's directory (the
    worker knows its session from then on): the seed, the session and the worker's
    incarnation choose it. Boundaries before that (making ``sessions/``) never kill.
    """

    def __init__(self, probability: float, seed: str) -> None:
        self.probability = probability
        self.seed = seed
        self.rng: random.Random | None = None

    def __call__(self, boundary: Boundary) -> None:
        if self.rng is None:
            session = session_of(boundary.path)
            if session is None:
                return
            self.rng = random.Random(f"{self.seed}:{incarnation(session)}")
        if self.rng.random() < self.probability:
            os.kill(os.getpid(), signal.SIGKILL)


class _RandomCommitKill:
    """A PostgreSQL boundary hook that SIGKILLs its own process at a random point of a
    fenced write: before its COMMIT or after it (see module doc)."""

    def __init__(self, probability: float, seed: str) -> None:
        self.probability = probability
        self.seed = seed
        self.rng: random.Random | None = None

    def __call__(self, point: Point, backend_pid: int) -> None:
        if self.rng is None:
            self.rng = random.Random(f"{self.seed}:{incarnation('store')}")
        if self.rng.random() < self.probability:
            os.kill(os.getpid(), signal.SIGKILL)


def chaos_app(budget: int) -> App:
    """The default app (or ``$LOOPD_CHAOS_APP``), in a worker that may die at any write
    boundary (see module doc)."""
    probability = float(os.environ.get(PROBABILITY_ENV, "0"))
    if probability > 0 and os.environ.get(STORE_ENV):
        boundaries.set_hook(_RandomCommitKill(probability, os.environ.get(SEED_ENV, "0")))
    elif probability > 0:
        durable.set_hook(_RandomKill(probability, os.environ.get(SEED_ENV, "0")))
    spec = os.environ.get(APP_ENV)
    return load_app(spec, budget) if spec else DefaultApp(budget)


def session_of(path: str) -> str | None:
    """The session whose directory ``path`` is or lies in (``.../sessions/<id>/...``)."""
    parts = os.path.normpath(path).split(os.sep)
    for index in range(len(parts) - 2, -1, -1):
        if parts[index] == SESSIONS_DIR:
            return parts[index + 1]
    return None


def incarnation(session: str) -> str:
    """``session:n``: this worker is the n-th of its session to write (counted in the
    schedule directory with exclusive creates), so its kills do not depend on its pid."""
    directory = os.environ.get(SCHEDULE_ENV)
    if not directory:
        return f"{session}:0"
    n = 0
    while True:
        try:
            os.close(os.open(os.path.join(directory, f"{session}.{n}"),
                             os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))  # fmt: skip
        except FileExistsError:
            n += 1
            continue
        return f"{session}:{n}"


@dataclass(slots=True)
class SupervisedReport:
    """What a supervised run did and found."""

    sessions: int
    acknowledged: dict[str, list[str]] = field(default_factory=dict)
    kills: int = 0
    restarts: int = 0
    failures: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    elapsed: float = 0.0

    def violate(self, invariant: str, what: str) -> None:
        self.violations.append(f"{invariant}: {what}")

    @property
    def invariants(self) -> Counter[str]:
        """The invariants violated, with their counts."""
        return Counter(v.split(":")[0] for v in self.violations)


def run_supervised(
    home: str,
    *,
    sessions: int = 3,
    requests: int = 30,
    duration: float = 20.0,
    seed: int = 0,
    boundary_kill_probability: float = 0.02,
    kill_interval: float = 0.05,
    app: str | None = None,
    schedule_dir: str | None = None,
    store: str | None = None,
    mutant: str | None = None,
    start_method: str | None = None,
) -> SupervisedReport:
    """Run the load and the kills for at most ``duration`` seconds; check the logs.

    ``app`` (module:attribute, importable from the working directory) replaces the
    default app in the workers; ``schedule_dir`` is where they count their incarnations
    (default: beside the home); ``store``: a PostgreSQL store's URI (``serve --store``);
    ``mutant``: one of ``chaos.mutants.SERVE_MUTANTS``, patched into serve;
    ``start_method``: serve's ``--start-method`` (default: its own, ``auto``).
    """
    rng = random.Random(seed)
    report = SupervisedReport(sessions=sessions)
    os.makedirs(home, exist_ok=True)
    schedule = schedule_dir or f"{os.path.abspath(home).rstrip(os.sep)}.schedule"
    os.makedirs(schedule, exist_ok=True)
    env = {**os.environ, SEED_ENV: str(seed), PROBABILITY_ENV: str(boundary_kill_probability),
           SCHEDULE_ENV: schedule}  # fmt: skip
    if app:
        env[APP_ENV] = app  # imported by the workers from serve's working directory, this one
    if store:
        env[STORE_ENV] = "1"  # which hook: the URI itself reaches the workers through serve
    # Workers die here by design, often and in a row: no intensity limit, a short
    # backoff so that the run measures the store and the restart path, not the waiting,
    # and no request taken for poison for the deaths it happened to be in flight for.
    serve = ["chaos.run.mutant_serve", mutant] if mutant else ["supervisor"]
    stderr = os.open(serve_stderr(home), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    daemon = subprocess.Popen(
        [sys.executable, "-m", *serve, "serve", "--home", home, "--app",
         "chaos.run.supervised:chaos_app", "--budget", "150", "--max-restarts", "100000",
         "--start-retries", "100000", "--backoff-base", "0.005", "--backoff-max", "0.05",
         "--stable-after", "0.5", "--poison-after", "1000",
         *(["--store", store] if store else []),
         *(["--start-method", start_method] if start_method else [])],
        env=env, stdout=subprocess.DEVNULL, stderr=stderr,
        # It dies with the rig (its workers follow: their control channel closes).
        preexec_fn=functools.partial(die_with_parent, os.getpid()),  # noqa: PLW1509 - no thread yet
    )  # fmt: skip
    os.close(stderr)  # serve holds its own copy
    start = time.monotonic()
    deadline = start + duration
    try:
        wait_listening(home, daemon, deadline)
        names = [f"chaos-{n}" for n in range(sessions)]
        for name in names:
            call_with_retry(home, "create", session=name, deadline=deadline)
            report.acknowledged[name] = []
        done = threading.Event()
        clients = [threading.Thread(target=_client, args=(home, name, requests, deadline,
                                                          report)) for name in names]  # fmt: skip
        killer = threading.Thread(target=_killer, args=(daemon.pid, rng, kill_interval, done,
                                                        report))  # fmt: skip
        looker = threading.Thread(target=look_for_shared, args=(daemon.pid, done, report.violate))
        killer.start()
        looker.start()
        for client in clients:
            client.start()
        for client in clients:
            client.join()
        done.set()
        killer.join()
        looker.join()
        rows = call(home, "status")
        report.restarts = sum(int(r["restarts"]) for r in rows) if isinstance(rows, list) else 0
    finally:
        for pid in stop_serve(daemon):
            report.violate("no-worker-outlives-serve", f"worker {pid} outlived the supervisor")
    report.elapsed = time.monotonic() - start
    _check(home, report, store)
    return report


def stop_serve(daemon: subprocess.Popen[bytes]) -> list[int]:
    """SIGTERM serve and reap it (SIGKILL past 30 s); the pids of the processes below it
    still alive 10 s after, SIGKILLed."""
    workers = psutil.Process(daemon.pid).children(recursive=True)
    daemon.send_signal(signal.SIGTERM)
    try:
        daemon.wait(timeout=30)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait()
    _gone, alive = psutil.wait_procs(workers, timeout=10)
    for proc in alive:
        proc.kill()
    return [proc.pid for proc in alive]


def serve_stderr(home: str) -> str:
    """Where the rig's serve writes its stderr: beside its home, as the schedule directory."""
    home = os.path.abspath(home)
    return os.path.join(os.path.dirname(home), f"{os.path.basename(home)}.serve.stderr")


def wait_listening(home: str, daemon: subprocess.Popen[bytes], deadline: float) -> None:
    """Return once serve answers a ping; RuntimeError with the end of its stderr if it exits."""
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            try:
                with open(serve_stderr(home), "rb") as said:
                    said.seek(max(0, os.fstat(said.fileno()).st_size - 2000))
                    tail = said.read().decode(errors="replace").strip()
            except OSError:
                tail = ""
            raise RuntimeError(
                f"the supervisor exited with {daemon.returncode}" + (f": {tail}" if tail else "")
            )
        if os.path.exists(os.path.join(home, SOCKET_NAME)):
            try:
                call(home, "ping", timeout=5)
            except ControlError:
                pass
            else:
                return
        time.sleep(0.01)
    raise RuntimeError("the supervisor did not listen before the deadline")


def _client(
    home: str, session: str, requests: int, deadline: float, report: SupervisedReport
) -> None:
    # Straight to the worker (the data path); after a death the client reconnects
    # through the daemon and sends the unanswered request again with its key.
    with Client(home, retry_for=max(1.0, deadline - time.monotonic())) as client:
        for n in range(requests):
            key = f"{session}-req-{n}"
            try:
                client.send(session, f"load {key}", key=key)
            except ControlError as exc:
                report.failures.append(f"{key}: {exc}")
                return
            report.acknowledged[session].append(key)


def _killer(
    daemon_pid: int,
    rng: random.Random,
    interval: float,
    done: threading.Event,
    report: SupervisedReport,
) -> None:
    parent = psutil.Process(daemon_pid)
    while not done.wait(interval * (0.5 + rng.random())):
        # Not serve's spare worker (named so from its fork): killed before it is ready
        # three times in a row, serve makes no more, and the rest of a run with
        # --start-method fork would test no worker a spare became.
        workers = [c for c in parent.children() if _name(c) not in SPARE_NAMES]
        if not workers:
            continue
        victim = rng.choice(workers)
        try:
            if victim.is_running():  # psutil checks the pid's create time: still the same
                victim.send_signal(signal.SIGKILL)
                report.kills += 1
        except psutil.NoSuchProcess:
            continue


def _name(proc: psutil.Process) -> str | None:
    try:
        return str(proc.name())
    except psutil.NoSuchProcess:
        return None


def _check(home: str, report: SupervisedReport, store: str | None) -> None:
    for session, acked in report.acknowledged.items():
        keys: list[str] = []

        def collect(records: Sequence[Record], keys: list[str] = keys) -> None:
            keys.extend(r.key for r in records if isinstance(r, User) and r.key)

        try:
            if store:
                from worker.store.postgres import PostgresStore  # noqa: PLC0415 - the driver
                from worker.store.postgres.transfer import read_session  # noqa: PLC0415

                read_session(PostgresStore(store), session, on_epoch=collect, history=True)
            else:
                load_session(session_dir(home, session), session, on_epoch=collect,
                             history=True)  # fmt: skip
        except SessionError as exc:
            report.violate("session-verifies", f"{session} does not verify: {exc}")
            continue
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            report.violate("applied-once", f"{session}: applied twice: {twice}")
        lost = sorted(set(acked) - set(keys))
        if lost:
            report.violate(
                "acknowledged-in-log", f"{session}: acknowledged but not in the log: {lost}"
            )
