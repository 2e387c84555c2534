"""The cases that catch each mutant, pinned for the test suite's quick check.

Written by ``python -m scripts.chaos.pin_mutant_cases``: for each mutant, the first and the
last case of its whole quick selection that the real store passes and the mutant fails
by the invariant it must break. A mutant with its own ``quick`` cases is not here.
"""

from __future__ import annotations

from typing import Final

PINNED: Final[dict[str, tuple[str, ...]]] = {
    "backup-manifest-before-fsync": (
        "operator-tools:power:names:101",
        "operator-tools:power:names:195",
    ),
    "baseline-after-log": ("basic:kill:-:31", "basic:kill:-:55"),
    "call-numbers-per-epoch": ("basic:kill:-:1", "basic:kill:-:56"),
    "carried-schedules-forgotten": ("schedules:kill:-:1", "schedules:kill:-:60"),
    "delivered-without-waiting": ("schedules:kill:-:1", "schedules:kill:-:60"),
    "directory-fsync-error-ignored": ("basic:io:eio:3:p1", "basic:io:eio:56:p1"),
    "epoch-end-not-fsynced": ("basic:power:names:32", "basic:power:names:56"),
    "fsync-after-memory": ("basic:io:eio:15", "basic:io:edquot:20"),
    "fsync-retried-and-trusted": ("basic:io:eio:12:pend", "basic:io:eio:40:pend"),
    "held-lock-taken-as-stale": ("basic:kill:-:1", "basic:kill:-:56"),
    "incomplete-group-accepted": ("basic:torn:lines:17", "basic:torn:lines:39"),
    "index-rebuild-without-fsync": (
        "operator-tools:power:drop:194",
        "operator-tools:power:names:195",
    ),
    "key-index-current-epoch-only": ("requests:kill:-:20", "requests:kill:-:54"),
    "lock-released-after-open": ("basic:kill:-:14", "basic:kill:-:56"),
    "next-baseline-ignores-summary": ("basic:kill:-:1", "basic:kill:-:56"),
    "next-call-from-newest-epoch": ("basic:kill:-:36", "basic:kill:-:39"),
    "next-epoch-keeps-its-app": ("versions:kill:-:14", "versions:kill:-:73"),
    "no-cut-back-after-failed-write": ("basic:io:enospc:15", "basic:io:edquot:41"),
    "no-directory-fsync": ("basic:power:drop:11", "basic:power:zeros:56"),
    "no-fsync": ("basic:power:names:12", "basic:power:names:56"),
    "no-lock": ("basic:kill:-:1", "basic:kill:-:56"),
    "open-carries-oldest-summary": ("basic:kill:-:56",),
    "open-forgets-prior-counts": ("basic:kill:-:36", "basic:kill:-:56"),
    "open-makes-nothing-durable": ("basic:kill:-:56:pend", "basic:io:eio:56:pend"),
    "open-or-create-always-initializes": ("basic:kill:-:22", "basic:kill:-:56"),
    "open-scan-drops-keys": ("basic:kill:-:16", "basic:kill:-:40"),
    "operator-summary-ignored": ("operator:kill:-:1", "operator:kill:-:72"),
    "parent-fsync-skipped-on-create": ("basic:power:drop:14", "basic:power:zeros:56"),
    "recorded-summary-rewritten": ("basic:kill:-:22", "basic:kill:-:55"),
    "rename-before-data-fsync": ("basic:power:names:13", "basic:power:names:55"),
    "rename-error-ignored": ("basic:io:eio:8", "basic:io:erofs:50"),
    "restore-skips-manifest-check": ("operator-tools:kill:-:87", "operator-tools:kill:-:114"),
    "restore-without-staging": ("operator-tools:kill:-:130", "operator-tools:kill:-:170"),
    "resume-recomputes-summary": ("operator:kill:-:20", "operator:kill:-:71"),
    "salvage-quarantine-name-not-synced": ("salvage:kill:-:18:p28", "salvage:io:eio:20:pend"),
    "salvage-truncates-before-quarantine": ("salvage:kill:-:40", "salvage:kill:-:43"),
    "second-epoch-end-on-resume": ("basic:kill:-:22", "basic:kill:-:55"),
    "short-write-not-looped": ("basic:short:fsize:6", "basic:short:fsize:39"),
    "silent-torn-tail-repair": ("basic:torn:1byte:15", "basic:torn:allbutlast:41"),
    "slot-reset-on-epoch": ("basic:kill:-:1", "basic:kill:-:56"),
    "torn-tail-ignored": ("basic:torn:1byte:15", "basic:torn:allbutlast:41"),
    "writer-takes-shared-lock": ("basic:kill:-:1", "basic:kill:-:56"),
}
