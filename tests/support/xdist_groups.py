"""Which tests one pytest-xdist worker must run together (``make test`` runs ``-n auto --dist loadgroup``).

A fixture wider than a module is built once per worker that runs a test needing it, so the tests
that share an expensive one go to one worker: every test of ``tests/engines`` (one vLLM server,
~3.5 GB and 30 s to minutes to start; the modules that start their own servers then never run
two at once) and every test of the quick demo (SmolLM2 rollouts, ~40 s). Every other test stays
with its module, so a module-scoped server starts once. An explicit ``xdist_group`` mark wins.

A new session- or package-scoped fixture that costs more than a few seconds belongs in
``SHARED_FIXTURES`` (or its folder in ``SHARED_FOLDERS``).
"""

from __future__ import annotations

import pytest

# folder (relative to the repository root, '/'-separated) -> group
SHARED_FOLDERS = {"tests/engines/": "vllm-server"}
# fixture name -> group
SHARED_FIXTURES = {"vllm_server": "vllm-server", "quick_demo": "quick-demo"}


def group_of(item: pytest.Item) -> str:
    """The xdist group of ``item``: a shared fixture's, else its module's."""
    path = item.nodeid.split("::", 1)[0]
    for folder, group in SHARED_FOLDERS.items():
        if path.startswith(folder):
            return group
    for name in getattr(item, "fixturenames", ()):
        if name in SHARED_FIXTURES:
            return SHARED_FIXTURES[name]
    return path


def mark_groups(items: list[pytest.Item]) -> None:
    """Give every item without an ``xdist_group`` mark its group (harmless without xdist)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group_of(item)))
