"""The README's rollouts appear in /ui of a default server, and a config that serves nothing says so.

The default server had no runs directory (the workbench showed nothing a rollout wrote), and
docs/workbench.md's config, lacking ``extends: builtin``, served 0 tools while check-config
answered "config OK: 0 tools".
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.server import REPO
from tool_server.config import load_config
from tool_server.workbench.files import Files


def test_the_default_server_opens_runs_under_where_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "arith.jsonl").write_text("{}\n")  # where the README's rollout writes
    monkeypatch.chdir(tmp_path)
    files = Files(load_config(None, environ={}).workbench.runs_dir)
    assert files.runs_dir == tmp_path / "runs"
    assert [f["name"] for f in files.listing(".jsonl", "anyone")] == ["arith.jsonl"]


def _check_config(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tool_server.cli", "check-config", "--config", str(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_check_config_warns_on_a_config_that_serves_nothing(tmp_path: Path) -> None:
    config = tmp_path / "workbench.yaml"
    config.write_text("workbench:\n  runs_dir: runs\n")  # docs/workbench.md's block before the fix
    done = _check_config(config)
    assert done.returncode == 0, done.stderr
    assert "config OK: 0 tools" in done.stdout
    assert "warning: this config serves nothing" in done.stderr and "extends: builtin" in done.stderr


def test_the_workbench_page_config_keeps_the_builtin_tools() -> None:
    page = (REPO / "docs" / "workbench.md").read_text()
    block = page.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert block.startswith("extends: builtin")
