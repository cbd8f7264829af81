"""Which tests one pytest-xdist worker must run together (``make test`` runs ``-n auto --dist loadgroup``).

A fixture wider than a module is built once per worker that runs a test needing it, so the tests
that share an expensive one go to one worker: every test of ``tests/engines`` (one vLLM server,
~3.5 GB and 30 s to minutes to start; the modules that start their own servers then never run
two at once) and every test of the quick demo (SmolLM2 rollouts, ~40 s) get an ``xdist_group``
mark. Every other test stays with its module (``ModuleOrGroupScheduling``), so a module-scoped
server starts once, and its id stays the plain one (xdist appends ``@group`` to a marked test's).

A new session- or package-scoped fixture that costs more than a few seconds belongs in
``SHARED_FIXTURES`` (or its folder in ``SHARED_FOLDERS``).
"""

from __future__ import annotations

import pytest

# folder (relative to the repository root, '/'-separated) -> group
SHARED_FOLDERS = {"tests/engines/": "vllm-server"}
# fixture name -> group
SHARED_FIXTURES = {"vllm_server": "vllm-server", "quick_demo": "quick-demo"}


def group_of(item: pytest.Item) -> str | None:
    """The xdist group of ``item`` if it shares an expensive fixture, else None (its module)."""
    path = item.nodeid.split("::", 1)[0]
    for folder, group in SHARED_FOLDERS.items():
        if path.startswith(folder):
            return group
    for name in getattr(item, "fixturenames", ()):
        if name in SHARED_FIXTURES:
            return SHARED_FIXTURES[name]
    return None


def mark_groups(items: list[pytest.Item]) -> None:
    """Mark the items that share an expensive fixture with its group (harmless without xdist).
    Must run before xdist's own collection hook, which reads the marks."""
    for item in items:
        group = group_of(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))


def module_or_group(nodeid: str) -> str:
    """The unit of work of ``nodeid``: its ``@group`` (added by xdist for a marked test), else its module."""
    if nodeid.rfind("@") > nodeid.rfind("]"):  # as xdist's LoadGroupScheduling: '@' in a param id is not one
        return nodeid.rsplit("@", 1)[-1]
    return nodeid.split("::", 1)[0]


try:
    from xdist.scheduler import LoadGroupScheduling
except ImportError:  # pytest-xdist is in the dev extra; without it the suite runs in one process
    LoadGroupScheduling = None
else:

    class ModuleOrGroupScheduling(LoadGroupScheduling):
        """``--dist loadgroup`` whose unmarked tests go by module (xdist's goes test by test)."""

        def _split_scope(self, nodeid: str) -> str:
            return module_or_group(nodeid)

        def _assign_work_unit(self, node: object) -> None:
            # the shared groups are the longest units (a vLLM server's start alone takes minutes
            # on a loaded machine): first, so that they never make the tail (xdist orders by count)
            for scope in [s for s in self.workqueue if not s.endswith(".py")]:
                self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)
