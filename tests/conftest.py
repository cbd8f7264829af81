"""Fixtures shared across test packages."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import xdist_groups
from tests.support.demo import QuickDemo, run_quick_demo
from tests.support.timeouts import scale_timeout


@pytest.fixture(scope="session")
def quick_demo(tmp_path_factory: pytest.TempPathFactory) -> QuickDemo:
    """The quick demo, run once per test session (SmolLM2 on the CPU, ~40 s): its end-to-end
    test checks the run, the workbench's test opens the rollout files it wrote."""
    return run_quick_demo(tmp_path_factory.mktemp("quick-demo") / "demo")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # a test that shares an expensive fixture must lie where the scheduler keeps its group together
    misplaced = xdist_groups.misplaced(items)
    if misplaced:
        raise pytest.UsageError(
            "tests that use a shared fixture outside its group's paths (add them to SHARED_PATHS in "
            "tests/support/xdist_groups.py): " + "; ".join(misplaced)
        )


if xdist_groups.LoadGroupScheduling is not None:  # a hook pytest only knows with xdist installed

    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
        if config.getvalue("dist") == "loadgroup":  # other modes: xdist's own
            return xdist_groups.ModuleOrGroupScheduling(config, log)
        return None

    def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
        return xdist_groups.auto_workers(len(os.sched_getaffinity(0)), xdist_groups.available_gb())


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    scale_timeout(item)  # before pytest-timeout's own wrapper reads the limit
    yield
