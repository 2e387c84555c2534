"""The rig's own pieces: the power-loss model, case ids, where a torn log must be refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chaos.cases import POWER_AT_END, Case
from chaos.faults.hook import FaultKind
from chaos.faults.model import DurableModel, PowerVariant
from chaos.oracle.torn import expected_torn_place


def _model(tmp_path: Path) -> tuple[DurableModel, str]:
    root = tmp_path / "home"
    root.mkdir()
    return DurableModel.snapshot(str(root)), str(root / "log")


def _write(model: DurableModel, path: str, data: bytes, *, mode: str = "ab") -> None:
    with open(path, mode) as f:
        f.write(data)
    model.apply({"step": "write", "path": path, "n": len(data)})


def test_a_failed_fsync_loses_its_bytes_even_after_a_later_fsync_succeeds(
    tmp_path: Path,
) -> None:
    model, path = _model(tmp_path)
    model.apply({"step": "create", "path": path})
    open(path, "wb").close()
    model.apply({"step": "fsync_dir", "path": os.path.dirname(path)})
    _write(model, path, b"first\n")
    model.apply({"step": "fsync", "path": path})
    _write(model, path, b"lost\n")
    model.apply({"step": "fsync", "path": path, "failed": True, "n": 0})
    _write(model, path, b"after\n")
    model.apply({"step": "fsync", "path": path})
    model.power_loss(PowerVariant.DROP)
    assert Path(path).read_bytes() == b"first\n" + b"\x00" * 5 + b"after\n"


def test_a_truncate_after_a_failed_fsync_removes_what_it_lost(tmp_path: Path) -> None:
    model, path = _model(tmp_path)
    model.apply({"step": "create", "path": path})
    open(path, "wb").close()
    model.apply({"step": "fsync_dir", "path": os.path.dirname(path)})
    _write(model, path, b"lost\n")
    model.apply({"step": "fsync", "path": path, "failed": True, "n": 0})
    os.truncate(path, 0)
    model.apply({"step": "truncate", "path": path, "n": 0})
    _write(model, path, b"again\n")
    model.apply({"step": "fsync", "path": path})
    model.power_loss(PowerVariant.DROP)
    assert Path(path).read_bytes() == b"again\n"


def test_the_names_variant_keeps_a_new_name_but_only_the_synced_bytes(tmp_path: Path) -> None:
    model, path = _model(tmp_path)
    tmp = path + ".tmp"
    model.apply({"step": "create", "path": tmp})
    _write(model, tmp, b"data\n", mode="wb")
    os.rename(tmp, path)
    model.apply({"step": "rename", "path": tmp, "target": path, "old": None})
    _dirs, files = model.durable_image(PowerVariant.NAMES)
    assert files == {path: b""}
    assert model.durable_image(PowerVariant.DROP)[1] == {}


@pytest.mark.parametrize(
    ("text", "power_at"), [("basic:kill:-:12:pend", POWER_AT_END), ("requests:io:eio:4:p3", 3)]
)
def test_a_case_id_with_a_power_loss_after_the_resume_round_trips(text: str, power_at: int) -> None:
    case = Case.parse(text)
    assert case.power_at == power_at
    assert case.recovery_at == 0
    assert case.id == text


def test_a_case_id_with_both_compounds_is_refused() -> None:
    with pytest.raises(ValueError, match="is not scenario:fault:variant:k"):
        Case.parse("basic:kill:-:12:r3:p2")
    assert Case.parse("basic:io:edquot:5").fault is FaultKind.IO


def test_a_group_left_open_by_whole_lines_is_torn_at_its_first_line(tmp_path: Path) -> None:
    logs = tmp_path / "sessions" / "chaos"
    logs.mkdir(parents=True)
    start = b'{"type":"SessionStart"}\n'
    (logs / "0.jsonl").write_bytes(
        start + b'{"type":"User","part":1,"parts":4}\n{"type":"ToolResult","part":2,"parts":4}\n'
    )
    assert expected_torn_place(str(tmp_path)) == (str(logs / "0.jsonl"), frozenset({2}))
    (logs / "0.jsonl").write_bytes(start + b'{"type":"User","more":true}\n{"type":"Assi')
    assert expected_torn_place(str(tmp_path)) == (str(logs / "0.jsonl"), frozenset({2, 3}))
