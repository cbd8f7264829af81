"""Packages' ``__all__`` lists cannot drift from their modules or from what the code imports.

A package ``__init__`` says what the part exports (DESIGN.md, Layout). A name renamed or removed
in a module while its package still lists it, or a name other code imports from a package that
does not list it, used to be found only by a reader.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("protocol", "tool_server", "tools", "trainer_client")
IMPORTERS = (*PACKAGES, "tests", "examples", "bench")


def _declared() -> dict[str, list[str]]:
    """package -> its ``__all__``, read from the source (no import)."""
    found = {}
    for top in PACKAGES:
        for init in sorted((REPO / top).rglob("__init__.py")):
            for node in ast.parse(init.read_text()).body:
                if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
                ):
                    found[".".join(init.relative_to(REPO).parent.parts)] = [
                        ast.literal_eval(e) for e in node.value.elts
                    ]
    return found


DECLARED = _declared()


def test_there_are_export_lists_to_check() -> None:
    assert len(DECLARED) >= 15, sorted(DECLARED)


@pytest.mark.parametrize("package", sorted(DECLARED))
def test_every_listed_name_exists_once(package: str) -> None:
    names = DECLARED[package]
    assert len(names) == len(set(names)), f"{package}.__all__ lists a name twice"
    module = importlib.import_module(package)
    missing = [name for name in names if not hasattr(module, name)]
    assert not missing, f"{package}.__all__ lists names it does not have: {missing}"


def _is_submodule(package: str, name: str) -> bool:
    folder = REPO.joinpath(*package.split("."))
    return (folder / f"{name}.py").is_file() or (folder / name / "__init__.py").is_file()


def test_what_the_code_imports_from_a_package_is_in_its_list() -> None:
    unlisted = set()
    for top in IMPORTERS:
        for path in (REPO / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in DECLARED:
                    unlisted |= {
                        f"{node.module}.{alias.name} ({path.relative_to(REPO)})"
                        for alias in node.names
                        if alias.name not in DECLARED[node.module]
                        and not alias.name.startswith("_")  # a test reaching in on purpose
                        and not _is_submodule(node.module, alias.name)
                    }
    assert not unlisted, "imported from a package that does not export it:\n" + "\n".join(sorted(unlisted))
