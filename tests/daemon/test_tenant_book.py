"""A home's record of its sessions' tenants (``supervisor.sessions.tenants``), and what a
certificate's subject makes of a tenant (``worker.ipc.tls_roles``), on real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.sessions.tenants import TenantBook, tenant_problem
from worker.ipc.tls_roles import tenant_of


def test_a_session_named_like_a_temporary_file_keeps_its_tenant(tmp_path: Path) -> None:
    """``foo.tmp`` is a session id: recording ``foo``'s tenant must not stage its file
    there (it would replace ``foo.tmp``'s, then rename it away)."""
    book = TenantBook(str(tmp_path))
    book.assign("foo.tmp", "acme")
    book.assign("foo", "globex")
    assert (book.owner("foo.tmp"), book.owner("foo")) == ("acme", "globex")
    again = TenantBook(str(tmp_path))  # as serve reads it at its next start
    assert (again.owner("foo.tmp"), again.owner("foo")) == ("acme", "globex")
    assert sorted(p.name for p in (tmp_path / "tenants").iterdir()) == ["foo", "foo.tmp"]
    book.assign("foo", None)
    assert TenantBook(str(tmp_path)).owner("foo") is None


def _cert(**subject: str) -> dict[str, object]:
    return {"subject": tuple(((key, value),) for key, value in subject.items())}


def test_no_certificate_names_the_operator_as_its_tenant() -> None:
    assert tenant_of(_cert(organizationName="acme", commonName="x")) == "acme"
    assert tenant_of(_cert(commonName="globex")) == "globex"
    assert tenant_of(_cert(organizationName="loopd-operator")) is None
    assert tenant_of(_cert(commonName="loopd-operator")) is None


@pytest.mark.parametrize("name", ["a\x1bb", "a\x9bb", "a\x85b", "a\u2028b", "a\u202eb", ""])
def test_a_tenant_name_with_a_control_or_bidi_character_is_refused(name: str) -> None:
    assert tenant_problem(name) is not None
    assert tenant_of(_cert(organizationName=name)) is None
