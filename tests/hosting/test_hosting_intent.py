"""The persisted operator intent: atomic, durable, and refused in one line when damaged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.hosting.intent import INTENT_NAME, IntentError, IntentFile


def test_a_missing_intent_file_means_nothing_is_stopped(tmp_path: Path) -> None:
    assert IntentFile(str(tmp_path)).load() == frozenset()


def test_a_stop_is_read_back_by_a_new_reader_and_a_start_forgets_it(tmp_path: Path) -> None:
    intent = IntentFile(str(tmp_path))
    intent.mark("a", stopped=True)
    intent.mark("b", stopped=True)
    assert IntentFile(str(tmp_path)).load() == {"a", "b"}
    intent.mark("a", stopped=False)
    assert IntentFile(str(tmp_path)).load() == {"b"}
    assert sorted(os.listdir(tmp_path)) == [INTENT_NAME]  # no temporary file left behind


def test_a_damaged_intent_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / INTENT_NAME).write_text('{"stopped": "a"}')
    with pytest.raises(IntentError, match=r"intent\.json: expected"):
        IntentFile(str(tmp_path)).load()


def test_a_failed_write_leaves_the_old_intent_in_memory_and_on_disk(tmp_path: Path) -> None:
    intent = IntentFile(str(tmp_path))
    intent.mark("a", stopped=True)
    (tmp_path / (INTENT_NAME + ".tmp")).mkdir()  # the temporary file cannot be created
    with pytest.raises(IntentError, match="cannot write"):
        intent.mark("b", stopped=True)
    assert intent.stopped == {"a"}
    assert IntentFile(str(tmp_path)).load() == {"a"}
