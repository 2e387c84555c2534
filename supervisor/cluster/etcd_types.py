"""What the etcd client sends and gets back: key-values, compares, operations, results.

The v3 JSON gateway speaks grpc-gateway's JSON: keys and values are base64, 64-bit
integers are decimal strings, and fields holding their zero value are left out of a
reply. The conversions live here and nowhere else.
"""

from __future__ import annotations

import base64
import contextlib
from dataclasses import dataclass, field
from typing import Final, Literal

Json = dict[str, object]
CompareTarget = Literal["CREATE", "MOD", "VERSION", "VALUE"]
CompareResult = Literal["EQUAL", "NOT_EQUAL", "GREATER", "LESS"]
_TARGET_FIELD: Final[dict[str, str]] = {
    "CREATE": "create_revision",
    "MOD": "mod_revision",
    "VERSION": "version",
    "VALUE": "value",
}


def encode_bytes(data: bytes) -> str:
    """Return ``data`` as the gateway's base64 text."""
    return base64.b64encode(data).decode("ascii")


def encode_key(key: str) -> str:
    """Return a key (UTF-8 text) as the gateway's base64 text."""
    return encode_bytes(key.encode("utf-8"))


def range_end_of_prefix(prefix: str) -> str:
    """Return the base64 range end that makes a range cover every key under ``prefix``."""
    end = bytearray(prefix.encode("utf-8"))
    while end and end[-1] == 0xFF:
        end.pop()
    if not end:
        return encode_bytes(b"\0")  # every key
    end[-1] += 1
    return encode_bytes(bytes(end))


def as_int(reply: Json, name: str) -> int:
    """Return a 64-bit integer field of a reply (a decimal string, absent when zero)."""
    value = reply.get(name, "0")
    if type(value) is int:
        return value
    if type(value) is str and len(value) <= 20:  # a 64-bit integer has at most 20 digits
        with contextlib.suppress(ValueError):
            return int(value)
    raise ValueError(f"field {name!r} is not an integer: {str(value)[:40]!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyValue:
    """One key as etcd holds it: its value and the revisions that fence with it."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def from_json(cls, kv: Json) -> KeyValue:
        """Decode one ``kvs`` element of a range or watch reply (ValueError if it is malformed)."""
        return cls(
            key=base64.b64decode(str(kv.get("key", "")), validate=True).decode("utf-8"),
            value=base64.b64decode(str(kv.get("value", "")), validate=True),
            create_revision=as_int(kv, "create_revision"),
            mod_revision=as_int(kv, "mod_revision"),
            version=as_int(kv, "version"),
            lease=as_int(kv, "lease"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Compare:
    """One condition of a transaction: ``target`` of ``key`` ``result`` ``operand``."""

    key: str
    target: CompareTarget
    result: CompareResult = "EQUAL"
    operand: int | bytes = 0

    def to_json(self) -> Json:
        """Encode for ``/v3/kv/txn``."""
        name = _TARGET_FIELD[self.target]
        operand = self.operand
        value = encode_bytes(operand) if isinstance(operand, bytes) else str(operand)
        return {
            "key": encode_key(self.key),
            "target": self.target,
            "result": self.result,
            name: value,
        }


def absent(key: str) -> Compare:
    """The condition that ``key`` does not exist (its create revision is 0)."""
    return Compare(key=key, target="CREATE", operand=0)


def modified_at(key: str, revision: int) -> Compare:
    """The condition that ``key`` was last written at ``revision`` (a fencing token)."""
    return Compare(key=key, target="MOD", operand=revision)


def value_is(key: str, value: bytes) -> Compare:
    """The condition that ``key`` holds exactly ``value`` (false when it does not exist)."""
    return Compare(key=key, target="VALUE", operand=value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Put:
    """Write ``value`` at ``key``, bound to ``lease`` when it is not 0."""

    key: str
    value: bytes
    lease: int = 0

    def to_json(self) -> Json:
        """Encode as a request body (also the ``request_put`` of a transaction)."""
        body: Json = {"key": encode_key(self.key), "value": encode_bytes(self.value)}
        if self.lease:
            body["lease"] = str(self.lease)
        return body


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyRange:
    """``key``, and every key under it when ``prefix``: what a read or a delete names."""

    key: str
    prefix: bool = False

    def to_json(self) -> Json:
        """Encode as a request body (the ``request_range`` or ``request_delete_range`` too)."""
        body: Json = {"key": encode_key(self.key)}
        if self.prefix:
            body["range_end"] = range_end_of_prefix(self.key)
        return body


@dataclass(frozen=True, slots=True, kw_only=True)
class Delete(KeyRange):
    """Delete ``key`` (and every key under it when ``prefix``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Get(KeyRange):
    """Read ``key`` (and every key under it when ``prefix``)."""


Operation = Put | Delete | Get


def operation_json(op: Operation) -> Json:
    """Encode one operation of a transaction's success or failure branch."""
    if isinstance(op, Put):
        return {"request_put": op.to_json()}
    if isinstance(op, Delete):
        return {"request_delete_range": op.to_json()}
    return {"request_range": op.to_json()}


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnResult:
    """A transaction's outcome: which branch ran, at which revision, and what its reads found."""

    succeeded: bool
    revision: int
    reads: list[list[KeyValue]] = field(default_factory=list)  # one per Get of the branch


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """A granted lease: its id and the TTL etcd granted, in seconds."""

    id: int
    ttl: int


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchEvent:
    """One change seen by a watch: a put (with the new key-value) or a delete."""

    kind: Literal["PUT", "DELETE"]
    kv: KeyValue
