"""The rooms of the repository: every folder named in the docs, none overfull, no long module.

docs/architecture.md ("What each folder owns") and the README's layout table have one
line per folder of the product; a folder holds about 20 modules at most and a module
400 lines; no test module imports another (what tests share lives in tests/harness/).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.harness.support import REPO

PRODUCT = ("worker", "supervisor", "chaos")
CODE = (*PRODUCT, "tests", "scripts", "examples")
# "About 20" (STYLE rule 15): past it a folder is several rooms.
MAX_MODULES = 21  # its __init__ counted
MAX_LINES = 400
_ROW = re.compile(r"^\| `([\w/]+)/` \|", re.M)


def _packages(roots: tuple[str, ...]) -> list[str]:
    """Every folder with an ``__init__.py`` under ``roots``, as ``a/b``."""
    found = []
    for root in roots:
        for init in sorted((REPO / root).rglob("__init__.py")):
            found.append(init.parent.relative_to(REPO).as_posix())
    return found


def _modules(folder: Path) -> list[Path]:
    return list(folder.glob("*.py"))  # its __init__ too


def _table_rows(doc: str) -> set[str]:
    return set(_ROW.findall((REPO / doc).read_text()))


@pytest.mark.parametrize("doc", ["README.md", "docs/architecture.md"])
def test_each_folder_of_the_product_has_its_line_and_each_line_names_a_folder(doc: str) -> None:
    rows = _table_rows(doc)
    folders = set(_packages(PRODUCT))
    assert sorted(folders - rows) == [], f"{doc} has no line for these folders"
    named = {row for row in rows if row.split("/")[0] in PRODUCT}
    assert sorted(named - folders) == [], f"{doc} names folders that do not exist"


def test_each_folder_says_what_it_is_in_one_docstring() -> None:
    for folder in _packages(PRODUCT):
        tree = ast.parse((REPO / folder / "__init__.py").read_text())
        assert ast.get_docstring(tree), f"{folder}/__init__.py has no docstring"


def test_no_folder_holds_more_than_about_twenty_modules() -> None:
    crowded = {
        folder: len(_modules(REPO / folder))
        for folder in [*CODE, *_packages(CODE)]
        if len(_modules(REPO / folder)) > MAX_MODULES
    }
    assert crowded == {}


def test_no_module_is_over_four_hundred_lines() -> None:
    long = {
        path.relative_to(REPO).as_posix(): lines
        for root in CODE
        for path in (REPO / root).rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_no_test_module_imports_another() -> None:
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            found += [
                f"{path.relative_to(REPO)}: {name}"
                for name in names
                if name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_")
            ]
    assert found == []
