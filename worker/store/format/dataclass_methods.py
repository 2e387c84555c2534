"""``__eq__``, ``__hash__`` and ``__repr__`` for the store's dataclasses, written once.

``dataclass()`` compiles each generated method from source text, one ``exec`` per
method and class: for a frozen class ``__init__``, ``__repr__``, ``__eq__``,
``__hash__``, ``__setattr__`` and ``__delattr__``, about 0.7 ms a class, which every
interpreter that imports the store paid some 25 times (issue 32). A class declared
with ``repr=False, eq=False`` that derives from ``Value`` (frozen, hashable) or
``MutableValue`` (unhashable, as a non-frozen dataclass with ``eq=True`` is) gets these
three from here instead, with the generated methods' behaviour: equal when of the same
class and every field is equal (else ``NotImplemented``), the hash of the fields'
tuple, ``Name(field=value, ...)`` in field order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from operator import attrgetter
from reprlib import recursive_repr
from typing import ClassVar, Final

_Getter = Callable[[object], tuple[object, ...]]
_GETTERS: Final[dict[type, tuple[_Getter, tuple[str, ...]]]] = {}


def _fields_of(cls: type) -> tuple[_Getter, tuple[str, ...]]:
    """The getter of a dataclass's field values as a tuple, and its field names."""
    found = _GETTERS.get(cls)
    if found is None:
        names = tuple(f.name for f in dataclasses.fields(cls))
        if len(names) == 1:
            one = attrgetter(names[0])
            getter: _Getter = lambda obj: (one(obj),)  # noqa: E731 - a tuple, as for many
        else:
            getter = attrgetter(*names) if names else lambda obj: ()
        found = _GETTERS[cls] = (getter, names)
    return found


class MutableValue:
    """Equality and repr as ``dataclass(eq=True, repr=True)`` generates them; no hash."""

    __slots__ = ()
    __hash__: ClassVar[None] = None  # type: ignore[assignment]  # as a mutable dataclass

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        values = _fields_of(self.__class__)[0]
        return values(self) == values(other)

    @recursive_repr()
    def __repr__(self) -> str:
        names = _fields_of(self.__class__)[1]
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{self.__class__.__qualname__}({shown})"


class Value(MutableValue):
    """Equality, hash and repr as ``dataclass(frozen=True)`` generates them."""

    __slots__ = ()

    def __hash__(self) -> int:  # type: ignore[override]  # frozen: hashable again
        return hash(_fields_of(self.__class__)[0](self))
