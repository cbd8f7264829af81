"""bench/ reads like a table of contents: scripts in folders by what they measure, each one listed.

Folders: server, client, environments, engines, peers, capacity (bench/README.md says what each
holds). Only the helpers the scripts share lie at the top.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
GROUPS = {"server", "client", "environments", "engines", "peers", "capacity"}
SHARED = {"__init__.py", "README.md", "loadgen.py", "git_ref.py", "figures.py", "results.py", "results"}


def _scripts() -> list[Path]:
    """The committed scripts (a script still being written has not been named yet)."""
    listed = subprocess.run(
        ["git", "ls-files", "bench"], cwd=BENCH.parent, capture_output=True, text=True
    ).stdout
    tracked = {BENCH.parent / line for line in listed.splitlines()}
    return sorted(
        p
        for p in BENCH.glob("*/*")
        if p.suffix in {".py", ".sh"} and p.name != "__init__.py" and p in tracked
    )


def test_only_groups_and_shared_helpers_lie_at_the_top() -> None:
    top = {p.name for p in BENCH.iterdir() if p.name != "__pycache__"}
    assert top - SHARED <= GROUPS, sorted(top - SHARED - GROUPS)


def test_every_script_is_named_in_the_readme() -> None:
    readme = (BENCH / "README.md").read_text()
    unnamed = [str(p.relative_to(BENCH)) for p in _scripts() if str(p.relative_to(BENCH)) not in readme]
    assert not unnamed, f"bench scripts missing from bench/README.md: {unnamed}"


def test_every_group_is_a_package() -> None:
    """``from bench.server.server_throughput import ...`` works for the scripts that share code."""
    assert all((BENCH / group / "__init__.py").is_file() for group in GROUPS)


def test_the_current_figures_table_is_written_from_the_results() -> None:
    """bench/README.md's table is bench/figures.py's rendering of bench/results/*.json, each figure
    with its conditions (a hand-made summary once dropped them: "vLLM 18.8x HF" without bf16 +
    prefix caching against fp32, where a plain decode gives 1.5-4x)."""
    import json

    from bench.figures import main

    assert main(["--check"]) == 0, "run .venv/bin/python bench/figures.py"
    for path in sorted((BENCH / "results").glob("*.json")):
        data = json.loads(path.read_text())
        assert data["command"] and data["date"] and data["load_average"], path
        assert all(f["conditions"].strip() for f in data["figures"]), (
            f"{path.name}: a figure without its conditions"
        )
