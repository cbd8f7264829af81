"""Which tests one pytest-xdist worker must run together (``make test`` runs ``-n auto --dist loadgroup``).

A fixture wider than a module is built once per worker that runs a test needing it, so the tests
that share an expensive one go to one worker: every test of ``tests/engines`` (one vLLM server,
~3.5 GB and 30 s to minutes to start; the modules that start their own servers then never run
two at once) and every test of the quick demo (SmolLM2 rollouts, ~40 s) get an ``xdist_group``
mark; veRL's two runs with their own Ray cluster and vLLM replica form a group of their own, so
they never run beside each other but may beside the shared server. Every other test stays with
its module (``ModuleOrGroupScheduling``), so a module-scoped server starts once, and its id
stays the plain one (xdist appends ``@group`` to a marked test's).

The units start longest first (``LONG_UNITS``), so that no long one is left for the end while
the other workers idle; ``auto_workers`` says how many workers ``-n auto`` starts.

A new session- or package-scoped fixture that costs more than a few seconds belongs in
``SHARED_FIXTURES`` (or its path in ``SHARED_PATHS``); a module that takes more than ~30 s,
in ``LONG_UNITS``.
"""

from __future__ import annotations

import os

import pytest

# module or folder (relative to the repository root, '/'-separated) -> group; the first match wins
SHARED_PATHS = {
    "tests/engines/test_verl_trainer_cpu.py": "verl-ray",
    "tests/engines/test_verl_replica.py": "verl-ray",
    "tests/engines/": "vllm-server",
}
# fixture name -> group
SHARED_FIXTURES = {"vllm_server": "vllm-server", "quick_demo": "quick-demo"}


def group_of(item: pytest.Item) -> str | None:
    """The xdist group of ``item`` if it shares an expensive fixture, else None (its module)."""
    path = item.nodeid.split("::", 1)[0]
    for prefix, group in SHARED_PATHS.items():
        if path.startswith(prefix):
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


# Seconds each long unit took (its tests summed: the loaded fresh-clone run of f43744c, load 3-4;
# only the order matters). They start first, longest first; the others follow in xdist's order
# (most tests first), which had put a 220 s module of six tests near the end of the run.
LONG_UNITS = {
    "vllm-server": 845,
    "verl-ray": 677,
    "quick-demo": 236,
    "tests/trainer/training/test_grpo.py": 228,
    "tests/test_gpu_check.py": 220,
    "tests/envs/test_reward_parity_tau2.py": 180,
    "tests/examples/test_learning_examples.py": 137,
    "tests/envs/tau2/test_gold_served.py": 136,
    "tests/envs/tau2/test_packs.py": 124,
    "tests/verl/test_cpu_platform.py": 121,
    "tests/envs/test_env_cli.py": 114,
    "tests/chaos/test_session_leases.py": 88,
    "tests/envs/tau2/test_refused_calls.py": 74,
    "tests/verl/test_agent_loop.py": 73,
    "tests/trainer/training/test_sft.py": 59,
    "tests/test_docs_blocks.py": 54,
    "tests/server/upstream/test_proxying.py": 52,
    "tests/envs/tau2/test_dual.py": 50,
    "tests/server/upstream/test_unruly.py": 46,
    "tests/verifiers/test_reward_hacking.py": 44,
}


def longest_first(units: list[str]) -> list[str]:
    """``units`` with the known long ones first, longest first; the rest keep their order."""
    return sorted(units, key=lambda unit: -LONG_UNITS.get(unit, 0))


# A worker's peak with its share of the suite: the vLLM group's worker holds the shared server
# (~3.5 GB) and a trainer beside it; veRL's runs hold Ray, an FSDP actor and a replica.
GB_PER_WORKER = 6


def auto_workers(cores: int, available_gb: float) -> int:
    """Workers for ``-n auto``: one more than the cores where memory allows it, else one per core
    (xdist's own). Many tests wait on a server, a subprocess's start or a generous TTL, and a
    worker per core left part of a quiet 2-core machine idle; the timeouts absorb the load."""
    return cores + 1 if available_gb >= GB_PER_WORKER * (cores + 1) else cores


def available_gb() -> float:
    """Memory the kernel could give without swapping (MemAvailable), in GiB; the total where
    /proc/meminfo is missing."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


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
            # the long units first, so that none makes the tail (xdist's order is by test count)
            for scope in reversed(longest_first([s for s in self.workqueue if s in LONG_UNITS])):
                self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)
