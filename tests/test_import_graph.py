"""The import graph of the four packages: no cycles, and the arrows point one way.

Every import counts, wherever it is written: at the top, inside a function, or under
``TYPE_CHECKING`` (a type-only cycle still ties two files together for a reader). A cycle
is broken by moving the shared record or function to a module both use, or by passing it
in (a ``Protocol`` naming what one side needs of the other).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "tool_server", "tools", "trainer_client")
# Which top-level packages each may import (protocol ← tools ← tool_server; the trainer
# client knows the server only through protocol and the wire).
ALLOWED = {
    "protocol": {"protocol"},
    "tools": {"protocol", "tools"},
    "tool_server": {"protocol", "tools", "tool_server"},
    "trainer_client": {"protocol", "trainer_client"},
}


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the four packages."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imports_of(module: str, path: Path, modules: dict[str, Path], *, at_import: bool = False) -> set[str]:
    """The project modules ``module`` imports. ``from pkg import sub`` is an edge to the
    submodule ``pkg.sub``; ``from pkg import name`` one to ``pkg`` (its ``__init__``); a dotted
    name resolves to its longest prefix that is a module. ``at_import``: only the statements
    that run when the module is imported (its own body, not functions or ``TYPE_CHECKING``)."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    is_package = path.name == "__init__.py"
    found: set[str | None] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in _run_at_import(tree) if at_import else ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(resolve(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                found.add(
                    f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else resolve(source)
                )
    return {m for m in found if m is not None and m != module}


def _run_at_import(tree: ast.Module) -> list[ast.stmt]:
    """The statements of a module body that run on import: blocks of ``if``/``try``/``with``
    followed, ``if TYPE_CHECKING`` and function and class bodies left out."""
    statements: list[ast.stmt] = []
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        statements.append(node)
        if isinstance(node, ast.If) and not (
            isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        ):
            pending.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            pending.extend(
                node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
            )
        elif isinstance(node, ast.With):
            pending.extend(node.body)
    return statements


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports."""
    return {module: imports_of(module, path, modules) for module, path in modules.items()}


def runtime_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> what importing it runs: each module it imports at import time, and the
    ``__init__`` of every package above that module (Python runs those first), except the
    packages above the importing module itself, which are already being imported."""
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        own = _packages_above(module, modules) | {module}
        edges: set[str] = set()
        for target in imports_of(module, path, modules, at_import=True):
            edges |= ({target} | _packages_above(target, modules)) - own
        graph[module] = edges
    return graph


def _packages_above(module: str, modules: dict[str, Path]) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:n]) for n in range(1, len(parts)) if ".".join(parts[:n]) in modules}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_module_imports_form_a_cycle() -> None:
    graph = import_graph(module_files())
    found = cycles(graph)
    report = [
        " <-> ".join(component)
        + "\n"
        + "\n".join(f"    {m} imports {sorted(graph[m] & set(component))}" for m in component)
        for component in found
    ]
    assert not found, "import cycles (break each: move the shared part out, or pass it in):\n" + "\n".join(
        report
    )


def test_every_module_imports_on_its_own() -> None:
    """No cycle through a package's ``__init__``: importing ``a.x`` first runs ``a/__init__``; if
    that imports ``b.y`` whose package imports ``a.x`` back, one of them is half-made (an
    ImportError that depends on which module a program imports first)."""
    graph = runtime_graph(module_files())
    found = cycles(graph)
    report = [" <-> ".join(component) for component in found]
    assert not found, "import-time cycles through package __init__ files:\n" + "\n".join(report)


def test_arrows_point_one_way() -> None:
    graph = import_graph(module_files())
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        for target in targets
        if target.split(".")[0] not in ALLOWED[module.split(".")[0]]
    )
    assert not wrong, "imports against the layering (see docs/architecture.md):\n" + "\n".join(wrong)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        # a <-> b at the top of both files
        (
            {"protocol/a.py": "import protocol.b\n", "protocol/b.py": "from protocol import a\n"},
            [["protocol.a", "protocol.b"]],
        ),
        # a type-only import still ties them
        (
            {
                "tools/x/__init__.py": "",
                "tools/x/one.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tools.x.two import T\n",
                "tools/x/two.py": "def f():\n    from tools.x.one import g\n",
            },
            [["tools.x.one", "tools.x.two"]],
        ),
        # a package __init__ re-exporting a module that imports a name from the package
        (
            {
                "tools/p/__init__.py": "from tools.p.m import f\n",
                "tools/p/m.py": "from tools.p import TABLE\n",
            },
            [["tools.p", "tools.p.m"]],
        ),
        # a module importing a sibling through the package (a submodule, not the __init__): no cycle
        (
            {
                "tools/p/__init__.py": "from tools.p.m import f\n",
                "tools/p/m.py": "from tools.p import n\n",
                "tools/p/n.py": "",
            },
            [],
        ),
        # relative imports resolve like absolute ones
        (
            {
                "tools/q/__init__.py": "",
                "tools/q/a.py": "from .b import x\n",
                "tools/q/b.py": "from . import a\n",
            },
            [["tools.q.a", "tools.q.b"]],
        ),
    ],
)
def test_the_check_finds_cycles(tmp_path: Path, files: dict[str, str], expected: list[list[str]]) -> None:
    assert cycles(import_graph(module_files(tree(tmp_path, files)))) == expected


def tree(root: Path, files: dict[str, str]) -> Path:
    for package in PACKAGES:
        (root / package).mkdir()
        (root / package / "__init__.py").write_text("")
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_runtime_check_finds_cycles_through_package_inits(tmp_path: Path) -> None:
    files = {
        # templates/__init__ -> render -> rollout.observations: runs rollout/__init__ -> core -> templates.render
        "trainer_client/templates/__init__.py": "from trainer_client.templates.render import R\n",
        "trainer_client/templates/render.py": "from trainer_client.rollout.observations import text\n",
        "trainer_client/rollout/__init__.py": "from trainer_client.rollout.core import Core\n",
        "trainer_client/rollout/core.py": "from trainer_client.templates.render import R\n",
        "trainer_client/rollout/observations.py": "",
        # a lazy import (in a function) runs later: no cycle
        "tools/envs/__init__.py": "from tools.envs.host import Host\n",
        "tools/envs/host.py": "def score():\n    from tools.verifiers.reward import score\n",
        "tools/verifiers/__init__.py": "from tools.verifiers.reward import score\n",
        "tools/verifiers/reward.py": "from tools.envs.host import Host\n",
    }
    modules = module_files(tree(tmp_path, files))
    assert cycles(import_graph(modules)) == [["tools.envs.host", "tools.verifiers.reward"]]
    assert [c for c in cycles(runtime_graph(modules)) if "trainer_client.rollout" in c] == [
        [
            "trainer_client.rollout",
            "trainer_client.rollout.core",
            "trainer_client.templates",
            "trainer_client.templates.render",
        ]
    ]
    assert not [c for c in cycles(runtime_graph(modules)) if "tools.envs.host" in c]
