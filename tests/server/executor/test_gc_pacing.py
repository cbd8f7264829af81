"""Kept results and the garbage collector: nothing to walk twice, no pile-up between collections.

The server runs with a high young-generation threshold (``server.gc_threshold``), under which
CPython's own count never starts a collection while the idempotency store is in steady state
(each call keeps one result and drops one). These tests run the executor in that regime.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from protocol import Call
from tool_server.app import build_registry
from tool_server.config import config_from_dict
from tool_server.executor.admission import Caller
from tool_server.executor.executor import Executor
from tool_server.executor.gc_pacing import MIDDLE_EVERY, YOUNG_BUDGET, GcPacer

STORE = 10_000  # results the idempotency store keeps
BATCH = 500


@pytest.fixture
def server_gc() -> Iterator[list[int]]:
    """The server's GC regime (no automatic collection in these tests); the generations
    collected meanwhile."""
    collected: list[int] = []

    def on_gc(phase: str, info: dict) -> None:
        if phase == "stop":
            collected.append(info["generation"])

    threshold = gc.get_threshold()
    gc.collect()
    gc.set_threshold(10**9)
    gc.callbacks.append(on_gc)
    try:
        yield collected
    finally:
        gc.callbacks.remove(on_gc)
        gc.set_threshold(*threshold)


def executor() -> Executor:
    tools = [{"target": "tools.testing:echo"}]
    config = config_from_dict({"tools": tools, "idempotency": {"max_entries": STORE}}, environ={})
    return Executor(build_registry(config), config)


async def run_calls(ex: Executor, count: int, tag: str, after_batch=None) -> None:  # type: ignore[no-untyped-def]
    for start in range(0, count, BATCH):
        calls = [Call(f"{tag}-{i}", "echo", {"text": f"t{i}"}) for i in range(start, start + BATCH)]
        results = await ex.run_batch(calls, Caller(tenant="t"))
        assert not any(r.is_error for r in results)
        if after_batch is not None:
            after_batch()


def test_kept_results_leave_nothing_for_the_collector_to_walk_again(server_gc: list[int]) -> None:
    """A full store adds (almost) nothing to what any collection walks: with results kept as
    objects, every kept result added ~5 tracked objects (10,000 results: ~50,000)."""
    ex = executor()

    async def main() -> tuple[int, int]:
        await run_calls(ex, BATCH, "warm")  # first-call caches, the metrics' per-tool record
        gc.collect()
        empty = len(gc.get_objects())
        await run_calls(ex, STORE, "fill")
        gc.collect()
        return empty, len(gc.get_objects())

    empty, full = asyncio.run(main())
    assert ex.store_sizes()["idempotency"][0] >= STORE * 0.99  # full (its eviction works in steps)
    assert full - empty < STORE // 20, f"{full - empty} more tracked objects with {STORE} results kept"


def test_the_young_generation_stays_bounded_while_the_store_churns(server_gc: list[int]) -> None:
    """Under the server's threshold no automatic collection comes; the store's entries are still
    collected in small steps (GcPacer), not left to pile up for one long collection to walk."""
    ex = executor()
    young: list[int] = []

    async def main() -> None:
        await run_calls(ex, 3 * STORE, "churn", after_batch=lambda: young.append(len(gc.get_objects(0))))

    asyncio.run(main())
    assert ex.store_sizes()["idempotency"][0] >= STORE * 0.99  # full (its eviction works in steps)
    assert server_gc, "no collection at all: every kept result stayed in the young generation"
    assert max(young) < 2 * YOUNG_BUDGET, f"young generation reached {max(young)} objects"


def test_the_pacer_collects_once_its_budget_is_owed_and_the_middle_generation_every_tenth(
    server_gc: list[int],
) -> None:
    pacer = GcPacer(budget=100)
    for _ in range(99):
        pacer.owe(1)
    assert server_gc == []
    pacer.owe(1)
    assert server_gc == [0]
    for _ in range(MIDDLE_EVERY - 1):
        pacer.owe(100)
    assert server_gc == [0] * (MIDDLE_EVERY - 1) + [1]


def test_the_pacer_leaves_a_disabled_collector_alone(server_gc: list[int]) -> None:
    pacer = GcPacer(budget=10)
    gc.disable()
    try:
        pacer.owe(50)
    finally:
        gc.enable()
    assert server_gc == [] and pacer.owed == 0
