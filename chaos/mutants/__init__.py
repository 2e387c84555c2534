"""Deliberately broken stores, applied by monkeypatching inside a case's child only.

Each breaks one rule of the store; the rig must catch every one (``loopd chaos
mutants``), and each names the invariant that must catch it and the faults that do.
They live here, never in worker/, and never run outside a forked child.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from chaos.cases import ThenPower
from chaos.faults.hook import FaultKind
from chaos.mutants import (
    durability,
    epochs,
    pipelining,
    reading,
    schedules,
    seam,
    serve,
    slow_turns,
    streaming,
    tools,
    unseen,
    versions,
)
from worker.store.format import scan_summary

KILL: Final = (FaultKind.KILL,)


@dataclass(frozen=True, slots=True, kw_only=True)
class Mutant:
    """One broken store: the bug, how it is patched in, and what must catch it.

    ``faults``, ``then_power`` and ``scenarios`` choose the cases of the quick check
    (the test suite's); ``loopd chaos mutants`` runs every case.
    """

    name: str
    bug: str
    patch: Callable[[], None]
    caught_by: str
    faults: tuple[FaultKind, ...] = KILL
    then_power: ThenPower = ThenPower.NONE
    scenarios: tuple[str, ...] = ("basic",)
    quick: tuple[str, ...] = ()  # the quick check's own cases (ids), when given
    feature: str = ""  # what of loopd it breaks, for the score's table (default: its family)

    @property
    def area(self) -> str:
        """The feature it breaks: ``feature``, else the family its patch is written in."""
        return self.feature or _FAMILIES.get(self.patch.__module__, "the store")


# The feature each family of patches breaks (a mutant may name its own).
_FAMILIES: Final = {
    durability.__name__: "durable writes",
    epochs.__name__: "the epoch commit",
    reading.__name__: "open, the lock and the key index",
    unseen.__name__: "the store",
    streaming.__name__: "streaming",
    pipelining.__name__: "batches and pipelines",
    schedules.__name__: "scheduled requests",
    versions.__name__: "App versions",
}


_ALL: Final = (
    Mutant(name="no-fsync", bug="never fsyncs the log", patch=durability.no_fsync,
           caught_by="acknowledged-on-disk", faults=(FaultKind.POWER,)),
    Mutant(name="fsync-after-memory", bug="records reach memory before the fsync",
           patch=durability.fsync_after_memory, caught_by="acknowledged-on-disk",
           faults=(FaultKind.IO,)),
    Mutant(name="no-directory-fsync", bug="never fsyncs a directory after create or rename",
           patch=durability.no_directory_fsync, caught_by="acknowledged-on-disk",
           faults=(FaultKind.POWER,)),
    Mutant(name="second-epoch-end-on-resume", bug="resume closes the epoch again",
           patch=epochs.second_epoch_end_on_resume, caught_by="one-epoch-end-last"),
    Mutant(name="silent-torn-tail-repair", bug="open cuts a torn tail off by itself",
           patch=reading.silent_torn_tail_repair, caught_by="torn-log-refused-unchanged",
           faults=(FaultKind.TORN,)),
    Mutant(name="recorded-summary-rewritten",
           bug="resume rewrites the recorded EpochEnd with the caller's summary",
           patch=epochs.recorded_summary_rewritten, caught_by="carry-is-recorded-summary"),
    Mutant(name="call-numbers-per-epoch", bug="tool call numbers start again in every epoch",
           patch=epochs.call_numbers_per_epoch, caught_by="call-numbers-unique"),
    Mutant(name="no-lock", bug="open takes no lock", patch=reading.no_lock,
           caught_by="single-writer"),
    # Caught only because a failed fsync loses its bytes for good in the power-loss model.
    Mutant(name="fsync-retried-and-trusted",
           bug="a failed fdatasync is retried and its success trusted (fsyncgate)",
           patch=durability.fsync_retried_and_trusted, caught_by="acknowledged-on-disk",
           faults=(), then_power=ThenPower.END),
    # Caught only by I/O errors at the steps beyond write and fsync.
    Mutant(name="directory-fsync-error-ignored",
           bug="a failed fsync of a directory is ignored, its names taken as durable",
           patch=durability.directory_fsync_error_ignored, caught_by="acknowledged-on-disk",
           faults=(), then_power=ThenPower.FIRST),
    Mutant(name="rename-error-ignored", bug="a failed rename of an atomic write is ignored",
           patch=durability.rename_error_ignored, caught_by="final-state-opens",
           faults=(FaultKind.IO,)),
    # Caught only by real short writes (RLIMIT_FSIZE).
    Mutant(name="short-write-not-looped", bug="a short write is taken as the whole buffer",
           patch=durability.short_write_not_looped, caught_by="acknowledged-on-disk",
           faults=(FaultKind.SHORT,)),
    # Caught only by the power loss that makes names durable before data.
    Mutant(name="rename-before-data-fsync",
           bug="an atomic write renames its tmp file before fsyncing the data",
           patch=durability.rename_before_data_fsync, caught_by="final-state-opens",
           faults=(FaultKind.POWER,)),
    # Caught only by the probes with a shared lock and a real second Session.open.
    Mutant(name="writer-takes-shared-lock", bug="a writer takes a shared lock",
           patch=reading.writer_takes_shared_lock, caught_by="single-writer"),
    Mutant(name="held-lock-taken-as-stale",
           bug="an opener that finds the lock held goes on without it",
           patch=reading.held_lock_taken_as_stale, caught_by="single-writer"),
    # Caught only by comparing the resumed worker's reported state with the disk.
    Mutant(name="open-forgets-prior-counts", bug="open reports no prior users",
           patch=reading.open_forgets_prior_counts, caught_by="api-state-matches-disk"),
    Mutant(name="open-carries-oldest-summary",
           bug="open carries the first epoch's summary, not the last one's",
           patch=reading.open_carries_oldest_summary, caught_by="api-state-matches-disk"),
    # Caught only by an app whose summaries never repeat, and by the operator's compact.
    Mutant(name="resume-recomputes-summary",
           bug="the worker's resume builds the next baseline from a summary computed again",
           patch=epochs.resume_recomputes_summary, caught_by="carry-is-recorded-summary",
           scenarios=("operator",)),
    Mutant(name="operator-summary-ignored",
           bug="the worker's compact ignores the operator's summary",
           patch=epochs.operator_summary_ignored, caught_by="operator-summary-recorded",
           scenarios=("operator",)),
    # Caught only by a power loss after a resumed worker acknowledged more work.
    Mutant(name="open-makes-nothing-durable",
           bug="open does not fsync the files and directories it read",
           patch=reading.open_makes_nothing_durable, caught_by="acknowledged-on-disk",
           faults=(), then_power=ThenPower.END),
    # More broken rules, each caught by the invariant it breaks.
    Mutant(name="no-cut-back-after-failed-write",
           bug="what a failed write left stays in the log",
           patch=durability.no_cut_back_after_failed_write, caught_by="final-state-opens",
           faults=(FaultKind.IO,)),
    Mutant(name="parent-fsync-skipped-on-create",
           bug="create never fsyncs sessions/ after making the session directory",
           patch=durability.parent_fsync_skipped_on_create, caught_by="acknowledged-on-disk",
           faults=(FaultKind.POWER,)),
    Mutant(name="epoch-end-not-fsynced", bug="commit_epoch does not fsync its EpochEnd",
           patch=durability.epoch_end_not_fsynced, caught_by="final-state-opens",
           faults=(FaultKind.POWER,)),
    # Caught by a retry after a restart: the key is in no epoch the index covers.
    Mutant(name="open-scan-drops-keys",
           bug="open's scan of the newest log reads no User's key",
           patch=reading.open_scan_drops_keys, caught_by="no-key-twice"),
    Mutant(name="summary-tail-keys-dropped",
           bug="an open that takes a scan summary reads no key of the lines after it",
           patch=reading.summary_tail_keys_dropped, caught_by="no-key-twice",
           quick=("basic:kill:-:16", "basic:kill:-:40"),
           feature="the scan summary"),
    Mutant(name="summary-written-wrong",
           bug="the scan summary an open keeps leaves out the newest User's key",
           patch=reading.summary_written_wrong, caught_by="scan-summary-true",
           scenarios=("requests",), quick=("requests:kill:-:58", "requests:kill:-:59"),
           feature="the scan summary"),
    Mutant(name="kept-summary-drops-a-call",
           bug="the scan summary a writer keeps as its log grows leaves out its newest call",
           patch=reading.kept_summary_drops_a_call, caught_by="scan-summary-true",
           scenarios=("requests",), quick=("requests:kill:-:18", "requests:kill:-:39"),
           feature="the scan summary"),
    Mutant(name="incomplete-group-accepted",
           bug="open accepts a log whose last group commit is incomplete",
           patch=reading.incomplete_group_accepted, caught_by="keyed-request-complete",
           faults=(FaultKind.TORN,)),
    Mutant(name="baseline-after-log", bug="an epoch change writes its log before its baseline",
           patch=durability.baseline_after_log, caught_by="final-state-opens"),
    # A request in flight when its epoch closed is retried in the next; the store's own
    # guard refuses to apply it again, so the client's retry never completes: caught as
    # requests missing after the resume.
    Mutant(name="key-index-current-epoch-only",
           bug="a request key is looked up in the current epoch only",
           patch=reading.key_index_current_epoch_only, caught_by="acknowledged-on-disk",
           scenarios=("requests",)),
    Mutant(name="torn-tail-ignored", bug="open skips an unterminated last line",
           patch=reading.torn_tail_ignored, caught_by="torn-log-refused-unchanged",
           faults=(FaultKind.TORN,)),
    Mutant(name="lock-released-after-open", bug="open drops the lock once it read the files",
           patch=reading.lock_released_after_open, caught_by="single-writer"),
    Mutant(name="next-call-from-newest-epoch",
           bug="open counts the tool calls of the newest epoch only",
           patch=reading.next_call_from_newest_epoch, caught_by="call-numbers-unique"),
    Mutant(name="open-or-create-always-initializes",
           bug="opening an existing session through open_or_create writes it afresh",
           patch=reading.open_or_create_always_initializes,
           caught_by="no-second-epoch-end-on-resume"),
    Mutant(name="slot-reset-on-epoch", bug="a new epoch starts in slot 0",
           patch=epochs.slot_reset_on_epoch, caught_by="epochs-contiguous-and-consistent"),
    Mutant(name="next-baseline-ignores-summary",
           bug="an epoch change keeps the old baseline instead of the one from the summary",
           patch=epochs.next_baseline_ignores_summary, caught_by="carry-is-recorded-summary"),
    # The classes the rig once missed (issue 19), each caught only by what was added for it.
    Mutant(name="key-index-search-off-by-one",
           bug="a key index lookup starts one past the first matching hash",
           patch=unseen.key_index_search_off_by_one, caught_by="retry-answered-from-log",
           scenarios=("retries",), feature="retries by key",
           quick=("retries:kill:-:30", "retries:kill:-:60")),
    Mutant(name="commit-resets-call-counter",
           bug="an epoch commit restarts the live call counter from the carried number",
           patch=unseen.commit_resets_call_counter, caught_by="call-numbers-handed-out-once",
           scenarios=("calls",), feature="tool call numbers",
           quick=("calls:kill:-:1", "calls:kill:-:40")),
    Mutant(name="lease-read-before-write-only",
           bug="a cluster worker reads its lease before a group commit, not again after it",
           patch=unseen.lease_read_before_write_only, caught_by="no-ack-without-lease",
           faults=(FaultKind.LEASE,), scenarios=("cluster",),
           feature="cluster: the lease fence",
           quick=("cluster:lease:lapse:18", "cluster:lease:lapse:20")),
    Mutant(name="commit-failure-fails-request",
           bug="a request whose epoch commit failed is answered as not applied",
           patch=unseen.commit_failure_fails_request, caught_by="refused-means-not-applied",
           faults=(FaultKind.IO,), scenarios=("requests",),
           feature="the worker's answers",
           quick=("requests:io:eio:19", "requests:io:eio:21")),
    Mutant(name="create-follows-links",
           bug="a temporary file is created through a link planted in its place",
           patch=unseen.create_follows_links, caught_by="hostile-refused-unchanged",
           faults=(FaultKind.HOSTILE,), feature="a hostile disk",
           quick=("basic:hostile:link:5", "basic:hostile:link:27")),
    # Streaming and pipelined batches (issue 31), each caught only by its own scenario.
    Mutant(name="partial-to-first-request",
           bug="a partial the App names for one request of a batch goes to the batch's first",
           patch=streaming.partial_to_first_request, caught_by="partials-own-request-in-order",
           scenarios=("streaming",), feature="streaming",
           quick=("streaming:kill:-:1", "streaming:kill:-:18")),
    Mutant(name="partials-sent-newest-first",
           bug="a turn's partials are held and written when the turn ends, newest first",
           patch=streaming.partials_sent_newest_first, caught_by="partials-own-request-in-order",
           scenarios=("streaming",), feature="streaming",
           quick=("streaming:kill:-:1", "streaming:kill:-:18")),
    Mutant(name="repeated-key-not-flushed",
           bug="a key carried twice in one batch is looked up before its first is written",
           patch=pipelining.repeated_key_not_flushed, caught_by="repeated-key-applied-once",
           scenarios=("pipelined",), feature="batches and pipelines",
           quick=("pipelined:kill:-:1", "pipelined:kill:-:36")),
    # The operator's tools (issue 31), each caught only by the operator-tools scenario's
    # checks of what the tool left (chaos.oracle.tool_checks).
    Mutant(name="restore-skips-manifest-check",
           bug="restore takes a backup's files without checking its manifest",
           patch=tools.restore_skips_manifest_check, caught_by="backup-complete-or-refused",
           scenarios=("operator-tools",), feature="operator tools"),
    Mutant(name="backup-manifest-before-fsync",
           bug="backup writes its manifest and renames the copy before its files are fsynced",
           patch=tools.backup_manifest_before_fsync, caught_by="backup-complete-or-refused",
           faults=(FaultKind.POWER,), scenarios=("operator-tools",), feature="operator tools"),
    Mutant(name="restore-without-staging",
           bug="restore writes the backup's files straight into sessions/ID, one by one",
           patch=tools.restore_without_staging, caught_by="tool-rerun-completes",
           scenarios=("operator-tools",), feature="operator tools"),
    Mutant(name="index-rebuild-without-fsync",
           bug="the key index rebuild never fsyncs its files (only their directory)",
           patch=tools.index_rebuild_without_fsync, caught_by="key-index-finds-every-key",
           faults=(FaultKind.POWER,), scenarios=("operator-tools",), feature="operator tools"),
    Mutant(name="salvage-truncates-before-quarantine",
           bug="salvage cuts the damaged log before the lines it cuts are durable in quarantine",
           patch=tools.salvage_truncates_before_quarantine, caught_by="salvage-keeps-the-prefix",
           scenarios=("salvage",), feature="operator tools"),
    Mutant(name="salvage-quarantine-name-not-synced",
           bug="salvage fsyncs only the directories it makes, not a quarantine/ found there",
           patch=tools.salvage_quarantine_name_not_synced, caught_by="salvage-keeps-the-prefix",
           then_power=ThenPower.EVERY, scenarios=("salvage",), feature="operator tools"),
    # Slow turns (issue 31): the deadline, progress, chunks and the poison ledger.
    Mutant(name="progress-keeps-deadline",
           bug="progress() stamps the heartbeat but does not restart the request's deadline",
           patch=slow_turns.progress_keeps_deadline, caught_by="progress-spares-turn",
           scenarios=("slow",), feature="slow turns",
           quick=("slow:kill:-:40",)),
    Mutant(name="chunk-drops-last-request",
           bug="a chunk of several pipelined requests is handed to the App one short",
           patch=slow_turns.chunk_drops_last_request, caught_by="pipelined-answered-in-order",
           scenarios=("slow",), feature="slow turns",
           quick=("slow:kill:-:40",)),
    Mutant(name="deadline-never-armed",
           bug="a request's deadline is never armed: a turn may run past it and be applied",
           patch=slow_turns.deadline_never_armed, caught_by="overdue-turn-ended",
           scenarios=("slow",), feature="slow turns",
           quick=("slow:kill:-:40",)),
    Mutant(name="poison-death-counted-twice",
           bug="the poison ledger charges each death twice to the requests in flight",
           patch=slow_turns.poison_death_counted_twice, caught_by="poison-refused-after-deaths",
           scenarios=("slow",), feature="slow turns",
           quick=("slow:kill:-:40",)),
    # Scheduled requests (issue 33), each caught only by the schedules scenario's check.
    Mutant(name="carried-schedules-forgotten",
           bug="an epoch commit carries no pending schedule into the next epoch",
           patch=schedules.carried_schedules_forgotten,
           caught_by="schedule-delivered-once-not-early", scenarios=("schedules",)),
    Mutant(name="delivered-without-waiting",
           bug="delivery takes every pending schedule as due, whatever its time",
           patch=schedules.delivered_without_waiting,
           caught_by="schedule-delivered-once-not-early", scenarios=("schedules",)),
    # App versions (issue 33), caught only by the versions scenario's check.
    Mutant(name="next-epoch-keeps-its-app",
           bug="an epoch commit names the closing epoch's App version, not its writer's",
           patch=versions.next_epoch_keeps_its_app,
           caught_by="resumed-under-new-version", scenarios=("versions",)),
)  # fmt: skip
MUTANTS: Final[dict[str, Mutant]] = {m.name: m for m in _ALL}
# The PostgreSQL backend's mutants: their cases need a database, so they are scored by the
# seam's rig (chaos.postgres; ``quick`` holds its case ids), not by ``loopd chaos mutants``.
SEAM_MUTANTS: Final[dict[str, Mutant]] = {m.name: m for m in (
    Mutant(name="fence-checked-apart",
           bug="the owner's token is checked in a transaction of its own, before the write's",
           patch=seam.fence_checked_apart, caught_by="deposed-writes-invisible", faults=(),
           feature="the PostgreSQL seam", quick=("basic:fence:1", "basic:fence:5")),
    Mutant(name="sealed-log-read-from-directory",
           bug="a retry of a sealed epoch's key reads its log from a directory named after "
           "the session's URI", patch=seam.sealed_log_read_from_directory,
           caught_by="retry-answered-from-log", faults=(), feature="the PostgreSQL seam",
           quick=("basic:kill-after-commit:3", "basic:lost-before-commit:6")),
)}  # fmt: skip


# The supervisor's mutants: patched into a real ``loopd serve`` (chaos/run/mutant_serve.py),
# so into the templates and workers it forks; scored by the supervisor-level run that
# ``scenarios`` names (chaos.report.scoring.score_serve_mutant), each run clean as well.
SUPERVISED: Final = "supervised"  # chaos.run.supervised: the load, the killer, templates
SUPERVISED_FORK: Final = "supervised-fork"  # the same, workers forked from serve: its spare
CATCH_UP: Final = "catch-up"  # chaos.run.catch_up: schedules overdue at a restart
CLOCK_STEP: Final = "clock-step"  # chaos.run.clock_step: stopped workers after a clock step
SERVE_MUTANTS: Final[dict[str, Mutant]] = {
    m.name: m
    for m in (
        Mutant(
            name="template-worker-keeps-template-channel",
            bug="a worker forked by a template keeps the template's channel open",
            patch=serve.template_worker_keeps_template_channel,
            caught_by="workers-share-no-descriptor",
            faults=(),
            scenarios=(SUPERVISED,),
            feature="templates",
        ),
        Mutant(
            name="spare-worker-keeps-what-it-inherited",
            bug="the spare worker keeps every descriptor it inherited from serve, and so "
            "does the worker it becomes",
            patch=serve.spare_worker_keeps_what_it_inherited,
            caught_by="workers-share-no-descriptor",
            faults=(),
            scenarios=(SUPERVISED_FORK,),
            feature="the spare worker",
        ),
        Mutant(
            name="catch-up-in-name-order",
            bug="a restarted supervisor wakes the overdue sessions in name order, "
            "not the earliest due first",
            patch=serve.catch_up_in_name_order,
            caught_by="catch-up-earliest-due-first",
            faults=(),
            scenarios=(CATCH_UP,),
            feature="scheduled requests",
        ),
        Mutant(
            name="identity-by-wall-clock",
            bug="serve tells its workers from later processes of their pid by a wall-clock "
            "creation time (a step of the clock: no worker is signalled)",
            patch=serve.identity_by_wall_clock,
            caught_by="stopped-worker-killed",
            faults=(),
            scenarios=(CLOCK_STEP,),
            feature="hang detection",
        ),
    )
}


def find(name: str) -> Mutant | None:
    """The mutant ``name``, of any rig (None: no such mutant)."""
    return MUTANTS.get(name) or SEAM_MUTANTS.get(name) or SERVE_MUTANTS.get(name)


def apply(name: str | None) -> None:
    """Break the store in this process as the mutant ``name`` says (None: leave it whole).

    Every process of the rig calls it, so it also makes each open that scanned a line
    keep a scan summary (worker/store/format/scan_summary.py): the rig's logs are far
    below the size that keeps one, and each reopen of a case then reads the summary and
    scans only what came after it, the path a restart of a large session takes.
    """
    scan_summary.SUMMARY_AFTER = 0
    if name is None:
        return
    found = find(name)
    if found is None:
        raise ValueError(f"unknown mutant {name!r}; known: {', '.join([*MUTANTS, *SERVE_MUTANTS])}")
    found.patch()
