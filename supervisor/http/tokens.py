"""Bearer tokens of the HTTP port: loopd.toml's ``[tenants]``, each name to its token's SHA-256.

``[tenants]`` maps a tenant's name to the hex SHA-256 of its token (or a list of them,
for a rotation); the tokens themselves are never stored. ``loopd-operator`` is the
tenant that sees every session. A request's ``Authorization: Bearer TOKEN`` is hashed
and compared with every digest by ``hmac.compare_digest``; without ``[tenants]`` the
port asks for no token (docs/http.md, "Tenants and tokens").
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Final

from supervisor.hosting.config import TENANTS_KEY, ConfigError, read_table
from supervisor.sessions.tenants import tenant_problem

_DIGEST: Final = re.compile(r"[0-9a-fA-F]{64}")
_BEARER: Final = re.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr] +([\x21-\x7e]{1,4096})")


def hash_token(token: str) -> str:
    """The hex SHA-256 of a token, as ``[tenants]`` holds it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class TokenTable:
    """The tenants' token digests: (digest, tenant) pairs, a digest at most once."""

    digests: tuple[tuple[bytes, str], ...]

    def tenant_of(self, authorization: str | None) -> str | None:
        """The tenant whose token ``authorization`` (the header's value) bears; None when
        it bears no token, or one of no tenant. Every digest is compared, in constant time
        each: the time taken says nothing of which digest came close."""
        found = None if authorization is None else _BEARER.fullmatch(authorization)
        if found is None:
            return None
        presented = hashlib.sha256(found.group(1).encode("ascii")).digest()
        tenant = None
        for digest, name in self.digests:
            if hmac.compare_digest(digest, presented):
                tenant = name
        return tenant


def parse_tenants(table: object, path: str) -> TokenTable:
    """``[tenants]`` as read from TOML; ConfigError naming the key that is wrong."""
    if not isinstance(table, dict):
        raise ConfigError(path, f"[{TENANTS_KEY}] must be a table of tenant = digest")
    pairs: list[tuple[bytes, str]] = []
    seen: dict[bytes, str] = {}
    for name, value in table.items():
        problem = tenant_problem(name)
        if problem is not None:
            raise ConfigError(path, f"[{TENANTS_KEY}]: {problem}")
        values = value if isinstance(value, list) else [value]
        if not values:
            raise ConfigError(path, f"[{TENANTS_KEY}] {name!r}: no digest")
        for digest in values:
            if not isinstance(digest, str) or _DIGEST.fullmatch(digest) is None:
                raise ConfigError(path, f"[{TENANTS_KEY}] {name!r}: the SHA-256 of a token "
                                  "in hex (64 characters: printf %s TOKEN | sha256sum), not "
                                  f"{digest!r:.80}")  # fmt: skip
            raw = bytes.fromhex(digest)
            if raw in seen:
                raise ConfigError(path, f"[{TENANTS_KEY}] {name!r}: the same digest as "
                                  f"{seen[raw]!r}: one token is one tenant's")  # fmt: skip
            seen[raw] = name
            pairs.append((raw, name))
    return TokenTable(tuple(pairs))


def read_tokens(path: str) -> TokenTable | None:
    """The file's ``[tenants]``; None without the file or the table (no token asked)."""
    table = read_table(path)
    if table is None or TENANTS_KEY not in table:
        return None
    return parse_tenants(table[TENANTS_KEY], path)
