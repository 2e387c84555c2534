"""Mutants that break the epoch change, its resume, and what carries across epochs."""

from __future__ import annotations

import argparse
import os
import zlib

from worker.app import App
from worker.ipc.wire import Message
from worker.store import session
from worker.store.baseline import Baseline
from worker.store.disk import durable
from worker.store.format.records import EpochEnd, encode_lines


def second_epoch_end_on_resume() -> None:
    original = session.Session.commit_epoch

    def commit_epoch(self: session.Session, summary: str, baseline: Baseline) -> None:
        if isinstance(self._state.records[-1], EpochEnd):
            # The bug: close the epoch again instead of resuming with the recorded one.
            state = self._state
            end = EpochEnd(next=self.epoch + 1, summary=summary)
            data, crc = encode_lines([end], state.log_crc)
            assert self._log_fd is not None
            durable.write_all(self._log_fd, data, self._log_path)
            durable.fdatasync(self._log_fd, self._log_path)
            state.log_size, state.log_crc = state.log_size + len(data), crc
        original(self, summary, baseline)

    session.Session.commit_epoch = commit_epoch  # type: ignore[method-assign]


def recorded_summary_rewritten() -> None:
    original = session.Session.commit_epoch

    def commit_epoch(self: session.Session, summary: str, baseline: Baseline) -> None:
        last = self._state.records[-1]
        if isinstance(last, EpochEnd) and last.summary != summary:
            # The bug: "refresh" the recorded summary with the caller's, in place.
            old_size = len(encode_lines([last], 0)[0])
            with open(self._log_path, "rb") as f:
                before = zlib.crc32(f.read()[: self._size - old_size])
            line, crc = encode_lines(
                [EpochEnd(time=last.time, next=last.next, summary=summary)], before
            )
            assert self._log_fd is not None
            os.ftruncate(self._log_fd, self._size - old_size)
            os.write(self._log_fd, line)
            os.fsync(self._log_fd)
            self._size += len(line) - old_size
            self._state.log_size, self._state.log_crc = self._size, crc
            self._state.records[-1] = EpochEnd(time=last.time, next=last.next, summary=summary)
        original(self, summary, baseline)

    session.Session.commit_epoch = commit_epoch  # type: ignore[method-assign]


def call_numbers_per_epoch() -> None:
    original = session.Session.commit_epoch

    def commit_epoch(self: session.Session, summary: str, baseline: Baseline) -> None:
        original(self, summary, baseline)
        # The bug: tool call numbers start again in every epoch.
        self._state.max_call = 0
        self._next_call = 1

    session.Session.commit_epoch = commit_epoch  # type: ignore[method-assign]


def resume_recomputes_summary() -> None:
    from worker import process  # noqa: PLC0415 - only worker-level children load it

    def open_session(args: argparse.Namespace, app: App) -> session.Session:
        if args.create:
            opened = session.Session.open_or_create(
                args.home, args.session, app.initial_baseline(args.session), args.slot
            )
        else:
            opened = session.Session.open(args.home, args.session)
        if isinstance(opened.records[-1], EpochEnd):
            # The bug: the next baseline from a summary computed again, not the recorded one.
            summary = app.summarize(opened)
            opened.commit_epoch(summary, app.next_baseline(opened, summary))
        return opened

    process.open_session = open_session


def operator_summary_ignored() -> None:
    from worker.loop import server  # noqa: PLC0415 - only worker-level children load it

    original = server.Server._compact

    def compact(self: server.Server, request_id: object, message: Message) -> None:
        message = {k: v for k, v in message.items() if k != "summary"}  # the bug
        original(self, request_id, message)

    server.Server._compact = compact  # type: ignore[method-assign]


def slot_reset_on_epoch() -> None:
    original = session.Session.commit_epoch

    def commit_epoch(self: session.Session, summary: str, baseline: Baseline) -> None:
        self._state.slot = 0  # the bug: the new epoch starts in slot 0
        original(self, summary, baseline)

    session.Session.commit_epoch = commit_epoch  # type: ignore[method-assign]


def next_baseline_ignores_summary() -> None:
    original = session.Session.commit_epoch

    def commit_epoch(self: session.Session, summary: str, baseline: Baseline) -> None:
        original(self, summary, self.baseline)  # the bug: the old baseline goes on

    session.Session.commit_epoch = commit_epoch  # type: ignore[method-assign]
