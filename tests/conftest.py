"""Fixtures shared across test packages."""

from __future__ import annotations

import pytest

from tests.support.demo import QuickDemo, run_quick_demo


@pytest.fixture(scope="session")
def quick_demo(tmp_path_factory: pytest.TempPathFactory) -> QuickDemo:
    """The quick demo, run once per test session (SmolLM2 on the CPU, ~40 s): its end-to-end
    test checks the run, the workbench's test opens the rollout files it wrote."""
    return run_quick_demo(tmp_path_factory.mktemp("quick-demo") / "demo")
