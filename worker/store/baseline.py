"""The baseline an epoch starts from, with its canonical bytes and their SHA-256 hash."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from worker.store.format.dataclass_methods import Value


@dataclass(frozen=True, slots=True, kw_only=True, repr=False, eq=False)
class Baseline(Value):
    """``{"system", "memory", "tools"}`` written canonically; ``hash()`` is of those bytes."""

    system: str
    memory: str
    # JSON objects, as the application defines its tools; stored as a tuple so the
    # baseline stays immutable while accepting any sequence.
    tools: Sequence[dict[str, Any]] = field(default=())

    def __post_init__(self) -> None:
        if type(self.system) is not str or type(self.memory) is not str:
            raise TypeError("Baseline.system and Baseline.memory must be strings")
        tools = tuple(self.tools)
        if not all(type(t) is dict for t in tools):
            raise TypeError("Baseline.tools must be a sequence of JSON objects (dicts)")
        object.__setattr__(self, "tools", tools)

    def to_json(self) -> bytes:
        """Return the canonical bytes: sorted keys, no spaces, UTF-8, trailing newline."""
        document = {"system": self.system, "memory": self.memory, "tools": list(self.tools)}
        text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return text.encode("utf-8") + b"\n"

    def hash(self) -> str:
        """Return the SHA-256 hex digest of ``to_json()``."""
        return hashlib.sha256(self.to_json()).hexdigest()

    @classmethod
    def from_json(cls, data: bytes) -> Baseline:
        """Parse baseline bytes; raise ValueError naming what is wrong."""
        try:
            document = json.loads(data)
        except RecursionError as exc:
            raise ValueError("not valid JSON: values nested too deeply") from exc
        except ValueError as exc:
            raise ValueError(f"not valid JSON: {exc}") from exc
        if type(document) is not dict:
            raise ValueError("not a JSON object")
        if document.keys() != {"system", "memory", "tools"}:
            raise ValueError(
                f"keys must be exactly memory, system, tools; got {', '.join(sorted(document))}"
            )
        if type(document["tools"]) is not list:
            raise ValueError("tools must be a list")
        try:
            return cls(
                system=document["system"], memory=document["memory"], tools=document["tools"]
            )
        except TypeError as exc:
            raise ValueError(str(exc)) from exc


def hash_bytes(data: bytes) -> str:
    """Return the SHA-256 hex digest of ``data`` (the baseline hash of a file's exact bytes)."""
    return hashlib.sha256(data).hexdigest()
