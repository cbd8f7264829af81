"""Results kept as the JSON they were answered with: replays, tenants' keys, sizes, the cache."""

from __future__ import annotations

import asyncio

import orjson

from protocol import Call, Result, encode
from tool_server.app import build_registry
from tool_server.config import config_from_dict
from tool_server.executor.admission import Caller
from tool_server.executor.executor import Executor
from tool_server.executor.records import ENTRY_OVERHEAD, result_json


def executor(**overrides: object) -> Executor:
    tools = [{"target": "tools.testing:echo"}, {"target": "tools.calculator:calculator"}]
    config = config_from_dict({"tools": tools, **overrides}, environ={})
    return Executor(build_registry(config), config)


def run(ex: Executor, *calls: Call, caller: Caller = Caller()) -> list[Result]:
    return asyncio.run(ex.run_batch(list(calls), caller))


def test_a_replay_answers_the_very_result_first_given_byte_for_byte() -> None:
    ex = executor()

    async def main() -> tuple[Result, Result]:
        (first,) = await ex.run_batch([Call("c1", "echo", {"text": "é\u2028", "data": {"n": [1.5, None]}})])
        (again,) = await ex.run_batch([Call("c1", "echo", {"data": {"n": [1.5, None]}, "text": "é\u2028"})])
        return first, again

    first, again = asyncio.run(main())
    assert again == first and again is not first  # read back from the kept JSON
    assert result_json(again) == result_json(first) == encode(first)
    assert ex.metrics.replays._value.get() == 1


def test_a_reused_call_id_for_another_call_is_refused_whatever_differs() -> None:
    ex = executor()
    run(ex, Call("c1", "echo", {"text": "a"}, session=None))
    for other in (
        Call("c1", "echo", {"text": "b"}),
        Call("c1", "calculator", {"expression": "1+1"}),
        Call("c1", "echo", {"text": "a"}, session="s-1"),
    ):
        (refused,) = run(ex, other)
        assert refused.is_error and "already used for a different call" in refused.text, other


def test_tenants_keys_never_meet_however_their_names_and_ids_concatenate() -> None:
    """Keys are one string per (tenant, call_id): ids chosen to spell another tenant's key in a
    naive concatenation must still be new calls, not replays or refusals."""
    ex = executor()
    pairs = [("A", "B:x"), ("A:B", "x"), ("A:", "B:x"), ("1:A", "x"), ("3", ":A:B:x"), ("", "3:A:B:x")]
    texts = {}
    for i, (tenant, call_id) in enumerate(pairs):
        (result,) = run(ex, Call(call_id, "echo", {"text": f"call {i}"}), caller=Caller(tenant=tenant))
        assert not result.is_error, (tenant, call_id, result.text)
        texts[tenant, call_id] = result.structured["text"]
    assert texts == {pair: f"call {i}" for i, pair in enumerate(pairs)}
    # each tenant still replays its own
    for i, (tenant, call_id) in enumerate(pairs):
        (again,) = run(ex, Call(call_id, "echo", {"text": f"call {i}"}), caller=Caller(tenant=tenant))
        assert again.structured["text"] == f"call {i}"
    assert ex.metrics.replays._value.get() == len(pairs)


def test_the_store_counts_what_it_keeps_exactly_and_evicts_by_it() -> None:
    ex = executor(idempotency={"max_bytes": 20 * (ENTRY_OVERHEAD + 200)})
    results = run(ex, *(Call(f"c{i}", "echo", {"text": "x" * 50}) for i in range(10)))
    kept, size = ex.store_sizes()["idempotency"]
    assert kept == 10 and size == sum(len(encode(r)) + ENTRY_OVERHEAD for r in results)
    run(ex, *(Call(f"big{i}", "echo", {"text": "y" * 2000}) for i in range(10)))
    kept, size = ex.store_sizes()["idempotency"]
    assert size <= 20 * (ENTRY_OVERHEAD + 200) and kept < 20  # the oldest went first


def test_a_cache_hit_is_the_cached_result_under_the_new_id() -> None:
    ex = executor()
    (first,) = run(ex, Call("q1", "calculator", {"expression": "6*7"}))
    (hit,) = run(ex, Call("q2", "calculator", {"expression": "6*7"}))
    assert hit.cached and hit.call_id == "q2" and hit.elapsed_ms == 0.0
    assert (hit.content, hit.structured, hit.is_error) == (first.content, first.structured, first.is_error)
    assert orjson.loads(result_json(hit))["call_id"] == "q2"  # not the cached entry's bytes


def test_expired_results_leave_on_time_on_an_idle_server() -> None:
    """No put or get after the calls: only the executor's sweeper can drop them."""
    ex = executor(idempotency={"ttl_s": 0.2}, cache={"ttl_s": 0.2})

    async def main() -> tuple[int, int]:
        await ex.start()
        try:
            await ex.run_batch([Call(f"c{i}", "calculator", {"expression": f"{i}+1"}) for i in range(50)])
            kept = ex.store_sizes()["idempotency"][0] + ex.store_sizes()["cache"][0]
            async with asyncio.timeout(30):  # generous: the sweep runs every 50 ms here
                while any(entries for entries, _ in ex.store_sizes().values()):
                    await asyncio.sleep(0.05)
            return kept, sum(size for _, size in ex.store_sizes().values())
        finally:
            await ex.stop()

    kept, size_left = asyncio.run(main())
    assert kept == 100 and size_left == 0
