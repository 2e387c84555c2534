"""The store's dataclasses share ``__eq__``, ``__hash__`` and ``__repr__``
(worker/store/format/dataclass_methods.py) instead of a generated copy per class: each behaves
as the method ``dataclass()`` would have generated for it."""

from __future__ import annotations

import copy
import dataclasses
import operator
import pickle
from typing import Any

import pytest

from worker.store.baseline import Baseline
from worker.store.disk.durable import Boundary
from worker.store.epochs.carried_checks import EpochEndAt
from worker.store.epochs.carried_state import NextEpoch
from worker.store.epochs.epoch_log import DecodedLog
from worker.store.fencing import Fence
from worker.store.format.dataclass_methods import MutableValue, Value
from worker.store.format.record_types import RECORD_TYPES
from worker.store.key_index import KeyIndex
from worker.store.session_state import KeyRef, SessionState
from worker.store.stats import Histogram, WorkerStats

SHARED: tuple[type, ...] = (
    *RECORD_TYPES, Baseline, Boundary, Fence, NextEpoch, EpochEndAt,
    KeyIndex, KeyRef, SessionState, DecodedLog, Histogram, WorkerStats,
)  # fmt: skip


def _generated(cls: type) -> type:
    """The same fields, with the methods dataclass() generates (the reference)."""
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    # Copies of the fields: make_dataclass writes its own type into each Field it is given,
    # and the class's own fields must keep theirs (the codecs compile from them).
    fields = [(f.name, object, copy.copy(f)) for f in dataclasses.fields(cls)]
    reference = dataclasses.make_dataclass(cls.__name__, fields, frozen=params.frozen)
    reference.__qualname__ = cls.__qualname__
    return reference


def _values(cls: type, salt: str) -> dict[str, Any]:
    """A value for every field: distinct per field and per ``salt``, nested for a repr."""
    return {f.name: (f.name, salt, [1.5, {"k": None}]) for f in dataclasses.fields(cls)}


def _build(cls: type, values: dict[str, Any]) -> Any:
    made: Any = object.__new__(cls)
    for name, value in values.items():
        object.__setattr__(made, name, value)  # past __post_init__'s checks of types
    return made


@pytest.mark.parametrize("cls", SHARED, ids=lambda cls: cls.__name__)
def test_a_shared_method_gives_what_the_generated_one_gave(cls: type) -> None:
    assert issubclass(cls, MutableValue), "it takes the shared methods"
    assert "__eq__" not in vars(cls), "none generated"
    assert "__repr__" not in vars(cls), "none generated"
    reference = _generated(cls)
    values, others = _values(cls, "a"), _values(cls, "b")
    one, same, other = _build(cls, values), _build(cls, values), _build(cls, others)
    assert repr(one) == repr(_build(reference, values))
    assert one == same
    assert operator.ne(one, same) is False
    assert one != other
    assert operator.eq(one, other) is False
    assert one.__eq__(_build(reference, values)) is NotImplemented, "another class"
    for name in values:  # every field takes part in equality
        changed = _build(cls, {**values, name: "changed"})
        assert one != changed, name
    if issubclass(cls, Value):
        hashable = {name: name for name in values}
        hashed = _build(cls, hashable)
        assert hash(hashed) == hash(_build(reference, hashable)) == hash(_build(cls, hashable))
    else:
        with pytest.raises(TypeError, match="unhashable"):
            hash(one)


@pytest.mark.parametrize("cls", RECORD_TYPES, ids=lambda cls: cls.__name__)
def test_a_record_stays_frozen_slotted_keyword_only_and_picklable(cls: type) -> None:
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    assert params.frozen
    values = _values(cls, "a")
    record = _build(cls, values)
    assert not hasattr(record, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.time = "later"
    with pytest.raises(TypeError, match="positional"):
        cls("a")
    assert pickle.loads(pickle.dumps(record)) == record  # noqa: S301 - our own bytes


def test_a_record_that_holds_itself_repr_s_as_an_ellipsis() -> None:
    state = KeyIndex.__new__(KeyIndex)
    for f in dataclasses.fields(KeyIndex):
        object.__setattr__(state, f.name, None)
    first = dataclasses.fields(KeyIndex)[0].name
    object.__setattr__(state, first, [state])
    assert f"{first}=[...]" in repr(state)
