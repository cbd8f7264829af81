"""Which tests one pytest-xdist worker must run together (``make test`` runs ``-n auto --dist loadgroup``).

A fixture wider than a module is built once per worker that runs a test needing it, so the tests
that share an expensive one go to one worker: every test of ``tests/engines`` (one vLLM server,
~3.5 GB and 30 s to minutes to start; the modules that start their own servers then never run
two at once) and the quick demo's two modules (SmolLM2 rollouts, ~40 s); veRL's two runs with
their own Ray cluster and vLLM replica form a group of their own, so they never run beside each
other but may beside the shared server. Every other test stays with its module, so a
module-scoped server starts once.

The groups go by path (``SHARED_PATHS``), read from the node id by the scheduler
(``ModuleOrGroupScheduling``). Not by xdist's ``xdist_group`` marks: xdist 3.8 carries a mark to
the scheduler as an ``@group`` suffix of the node id, which pytest 9.2's node ids no longer take
(pytest-xdist#1386): the marks were silently ignored, and each worker that ran an engine test
started its own vLLM server. A test that uses a shared fixture outside its group's paths stops
the run at collection (``misplaced``).

The units start longest first (``LONG_UNITS``), so that no long one is left for the end while
the other workers idle; ``auto_workers`` says how many workers ``-n auto`` starts.

A new session- or package-scoped fixture that costs more than a few seconds belongs in
``SHARED_FIXTURES`` with its group's paths in ``SHARED_PATHS``; a module that takes more than
~30 s, in ``LONG_UNITS``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psutil

# module or folder (relative to the repository root, '/'-separated) -> group; the first match wins
SHARED_PATHS = {
    "tests/engines/test_verl_trainer_cpu.py": "verl-ray",
    "tests/engines/test_verl_replica.py": "verl-ray",
    "tests/engines/": "vllm-server",
    "tests/trainer/test_demo.py": "quick-demo",
    "tests/workbench/test_demo_rollout.py": "quick-demo",
}
# fixture name -> the group whose paths hold every test that uses it
SHARED_FIXTURES = {"vllm_server": "vllm-server", "quick_demo": "quick-demo"}


def group_of(nodeid: str) -> str | None:
    """The group of the test ``nodeid`` by its path, else None (it goes with its module)."""
    path = nodeid.split("::", 1)[0]
    for prefix, group in SHARED_PATHS.items():
        if path.startswith(prefix):
            return group
    return None


def unit_of(nodeid: str) -> str:
    """The unit of work of ``nodeid``: its group, else its module (an ``@group`` suffix, which a
    pytest whose node ids take it gets from an ``xdist_group`` mark, counts as a group)."""
    if nodeid.rfind("@") > nodeid.rfind("]"):  # as xdist's LoadGroupScheduling: '@' in a param id is not one
        return nodeid.rsplit("@", 1)[-1]
    return group_of(nodeid) or nodeid.split("::", 1)[0]


def misplaced(items: Iterable[Any]) -> list[str]:
    """The tests that use a shared fixture outside its group's paths (each worker running one
    would build the fixture again): '<node id> uses <fixture>' each."""
    return [
        f"{item.nodeid} uses {name}"
        for item in items
        for name in getattr(item, "fixturenames", ())
        if name in SHARED_FIXTURES and group_of(item.nodeid) != SHARED_FIXTURES[name]
    ]


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
    """Memory the kernel could give without swapping (MemAvailable), in GiB."""
    return psutil.virtual_memory().available / 2**30


try:
    from xdist.scheduler import LoadGroupScheduling
except ImportError:  # pytest-xdist is in the dev extra; without it the suite runs in one process
    LoadGroupScheduling = None
else:

    class ModuleOrGroupScheduling(LoadGroupScheduling):
        """``--dist loadgroup`` by ``unit_of``: a group or a module (xdist's goes test by test)."""

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        def _assign_work_unit(self, node: object) -> None:
            # the long units first, so that none makes the tail (xdist's order is by test count)
            for scope in reversed(longest_first([s for s in self.workqueue if s in LONG_UNITS])):
                self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)
