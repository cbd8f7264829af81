"""Tenants share the server fairly: free slots go round-robin, admission is capped per token.

With one FIFO semaphore a tenant that queued many slow calls made every other tenant's
call wait behind its whole backlog, and could take the whole admission capacity so that
the others got 429s. Each test here fails against that semaphore and that single cap.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from typing import Any

import httpx
import pytest

from protocol import Call, decode_results, new_call_id, tool
from tests.support.server import ServerProcess, running_server, server_config
from tool_server.app import build_registry
from tool_server.config import ConfigError, config_from_dict
from tool_server.executor.executor import Caller, Executor, Overloaded
from tool_server.executor.fair_slots import FairSlots

TOKEN_A = "fairness-tenant-a-0123456789"
TOKEN_B = "fairness-tenant-b-0123456789"
TOKENS = {"TOOLFACTORY_TOKENS": f"{TOKEN_A},{TOKEN_B}"}
A, B = Caller(tenant="A"), Caller(tenant="B")

ORDER: list[str] = []  # the tags of `gated` calls, in the order they got a slot
GATE: dict[str, asyncio.Event] = {}


@tool(name="gated", timeout_s=30)
async def gated(tag: str) -> str:
    """Records that it got a slot, then holds the slot until the test opens the gate."""
    ORDER.append(tag)
    await GATE["open"].wait()
    return tag


def make_executor(**limits: Any) -> Executor:
    config = config_from_dict(
        {"tools": [{"target": "tests.server.executor.test_tenant_fairness:gated"}], "limits": limits}
    )
    return Executor(build_registry(config), config)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


# ----------------------------------------------------------------- FairSlots on its own
async def test_free_slots_go_round_robin_across_tenants_and_fifo_within_one() -> None:
    slots, order = FairSlots(1), []
    await slots.acquire("A")

    async def take(tenant: str, tag: str) -> None:
        await slots.acquire(tenant)
        order.append(tag)
        slots.release()

    tasks = [asyncio.create_task(take(t, tag)) for t, tag in [("A", "a1"), ("A", "a2"), ("A", "a3")]]
    tasks += [asyncio.create_task(take("B", "b1")), asyncio.create_task(take("C", "c1"))]
    await settle()
    assert order == [] and slots.waiting == 5
    slots.release()
    await asyncio.gather(*tasks)
    assert order == ["a1", "b1", "c1", "a2", "a3"]  # FIFO would run b1 and c1 last
    assert slots.free == 1 and slots.waiting == 0


async def test_a_released_slot_goes_to_the_waiter_not_to_a_newcomer() -> None:
    slots, order = FairSlots(1), []
    await slots.acquire("A")

    async def take(tag: str) -> None:
        await slots.acquire("A")
        order.append(tag)
        slots.release()

    waiter = asyncio.create_task(take("waiter"))
    await settle()
    slots.release()
    newcomer = asyncio.create_task(take("newcomer"))  # before the waiter has run
    await asyncio.gather(waiter, newcomer)
    assert order == ["waiter", "newcomer"] and slots.free == 1


async def test_cancelled_waiters_neither_leak_nor_swallow_a_slot() -> None:
    slots = FairSlots(2)
    await slots.acquire("A")
    await slots.acquire("A")
    queued = {tag: asyncio.create_task(slots.acquire(tag[0])) for tag in ("A1", "A2", "B1", "A3")}
    await settle()
    queued["A2"].cancel()
    queued["B1"].cancel()
    await settle()
    assert slots.waiting == 2  # the cancelled ones left their queues
    slots.release()
    slots.release()
    await asyncio.gather(queued["A1"], queued["A3"])  # both got the freed slots
    slots.release()
    slots.release()
    assert slots.free == 2 and slots.waiting == 0

    # Handed a slot, then cancelled before it ran: the slot goes on to the next waiter.
    await slots.acquire("A")
    await slots.acquire("A")
    handed, next_one = asyncio.create_task(slots.acquire("A")), asyncio.create_task(slots.acquire("B"))
    await settle()
    slots.release()  # the slot is handed to `handed` now
    handed.cancel()
    assert (await asyncio.gather(handed, return_exceptions=True))[0].__class__ is asyncio.CancelledError
    await asyncio.wait_for(next_one, 5)
    slots.release()
    slots.release()
    assert slots.free == 2 and slots.waiting == 0


def test_fair_slots_refuse_zero_slots() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        FairSlots(0)


# ----------------------------------------------------------------- the executor, in-process
async def test_executor_serves_tenants_in_turn_and_survives_cancelled_waiters() -> None:
    ORDER.clear()
    GATE["open"] = asyncio.Event()
    executor = make_executor(max_concurrency=1)
    await executor.start()

    def run(caller: Caller, tag: str) -> asyncio.Task[Any]:
        return asyncio.create_task(executor.run_one(Call(new_call_id(), "gated", {"tag": tag}), caller))

    a = {tag: run(A, tag) for tag in ("a0", "a1", "a2", "a3", "a4", "a5")}
    await settle()
    b0 = run(B, "b0")
    await settle()
    a["a1"].cancel()  # two of A's queued calls go away (a client hung up)
    a["a2"].cancel()
    await settle()
    assert ORDER == ["a0"] and executor.admitted == 5
    GATE["open"].set()
    await asyncio.gather(*a.values(), b0, return_exceptions=True)
    # B's one call ran right after the call holding the slot; FIFO would run it last.
    assert ORDER == ["a0", "a3", "b0", "a4", "a5"]
    assert executor.admitted == 0 and executor.running == 0
    assert executor._slots.free == 1 and executor._slots.waiting == 0
    later = await executor.run_batch([Call(new_call_id(), "gated", {"tag": f"l{i}"}) for i in range(4)], A)
    assert [r.structured or r.content[0]["text"] for r in later] == ["l0", "l1", "l2", "l3"]
    await executor.stop()


async def test_executor_caps_what_one_tenant_may_hold_but_admits_the_others() -> None:
    GATE["open"] = asyncio.Event()
    executor = make_executor(max_concurrency=1, max_queue=7, max_admitted_per_tenant=3)
    await executor.start()
    held = asyncio.create_task(
        executor.run_batch([Call(new_call_id(), "gated", {"tag": "a"}) for _ in range(3)], A)
    )
    await settle()
    with pytest.raises(Overloaded, match=r"may hold 3 \(limits.max_admitted_per_tenant\)"):
        await executor.run_batch([Call(new_call_id(), "gated", {"tag": "a"})], A)
    refused = await executor.run_one(Call(new_call_id(), "gated", {"tag": "a"}), A)
    assert refused.error.kind == "overloaded" and "max_admitted_per_tenant" in refused.error.message
    others = asyncio.create_task(
        executor.run_batch([Call(new_call_id(), "gated", {"tag": "b"}) for _ in range(3)], B)
    )
    await settle()
    assert executor.admitted == 6
    GATE["open"].set()
    assert not any(r.is_error for r in await held + await others)
    await executor.stop()


def test_default_share_is_three_quarters_and_a_bad_one_is_a_config_error() -> None:
    assert make_executor(max_concurrency=4, max_queue=12).tenant_share == 12
    assert make_executor(max_concurrency=4, max_queue=12, max_admitted_per_tenant=100).tenant_share == 16
    with pytest.raises(ConfigError, match="max_admitted_per_tenant must be at least 1"):
        make_executor(max_admitted_per_tenant=0)


# ----------------------------------------------------------------- a real server, two tokens
def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def sleeps(n: int, seconds: float) -> list[dict[str, Any]]:
    return [
        {"call_id": uuid.uuid4().hex, "name": "sleep", "arguments": {"seconds": seconds}} for _ in range(n)
    ]


def metric(srv: ServerProcess, pattern: str) -> float:
    page = httpx.get(srv.url + "/metrics", headers=auth(TOKEN_B))
    assert page.status_code == 200, page.text
    found = re.search(pattern + r" ([0-9.e+]+)", page.text)
    assert found, f"no {pattern} in /metrics"
    return float(found.group(1))


async def wait_for_queue(srv: ServerProcess, depth: int) -> None:
    """Until the server has ``depth`` calls waiting for a slot (a wait, not an assertion)."""
    deadline = time.monotonic() + 60
    while metric(srv, "toolfactory_queue_depth") < depth:
        assert time.monotonic() < deadline, "the flood was never queued"
        await asyncio.sleep(0.05)


def test_one_tenants_backlog_does_not_delay_another_tenants_call() -> None:
    flood = 12
    config = server_config(limits={"max_concurrency": 1, "max_queue": 64})
    with running_server(config, env=TOKENS) as srv:

        async def scenario() -> tuple[float, list[Any]]:
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
                a = asyncio.create_task(
                    client.post("/v1/calls", json={"calls": sleeps(flood, 0.4)}, headers=auth(TOKEN_A))
                )
                await wait_for_queue(srv, flood - 1)
                b = await client.post("/v1/calls", json={"calls": sleeps(1, 0.4)}, headers=auth(TOKEN_B))
                # How many sleeps had finished when B's answer came: B's own and A's before it.
                finished_with_b = metric(srv, r'toolfactory_calls_total\{outcome="ok",tool="sleep"\}')
                assert b.status_code == 200 and not decode_results(b.content)[0].is_error
                return finished_with_b, decode_results((await a).content)

        finished_with_b, a_results = asyncio.run(scenario())
        assert all(not r.is_error for r in a_results)
        # Round-robin: B ran after A's running call (plus the few that ended since B's answer);
        # FIFO ran it after all of A's backlog: finished_with_b would be flood + 1.
        assert finished_with_b <= flood // 2, finished_with_b


def test_a_tenant_over_its_share_gets_429_while_another_is_admitted() -> None:
    # capacity 8; the default share is 3/4 of it: 6 admitted calls per token
    config = server_config(limits={"max_concurrency": 1, "max_queue": 7, "retry_after_s": 3})
    with running_server(config, env=TOKENS) as srv:

        async def scenario() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
                a = asyncio.create_task(
                    client.post("/v1/calls", json={"calls": sleeps(6, 0.5)}, headers=auth(TOKEN_A))
                )
                await wait_for_queue(srv, 5)
                over = await client.post("/v1/calls", json={"calls": sleeps(1, 0)}, headers=auth(TOKEN_A))
                other = await client.post("/v1/calls", json={"calls": sleeps(1, 0)}, headers=auth(TOKEN_B))
                return over, other, await a

        over, other, flood = asyncio.run(scenario())
        assert over.status_code == 429 and over.headers["retry-after"] == "3"
        assert over.json()["error"]["kind"] == "overloaded"
        assert "one token may hold 6 (limits.max_admitted_per_tenant)" in over.json()["error"]["message"]
        assert other.status_code == 200 and not decode_results(other.content)[0].is_error
        assert flood.status_code == 200 and all(not r.is_error for r in decode_results(flood.content))


def test_a_batch_larger_than_a_token_may_ever_hold_says_so_and_the_client_gets_through() -> None:
    # capacity 8, share 6: seven calls from one token are never admitted at once, however
    # long it waits. The 429 says so (before: "retry this batch later", which never worked);
    # ToolClient learns its window from the 429 and sends at most what was admitted.
    config = server_config(limits={"max_concurrency": 1, "max_queue": 7})
    with running_server(config, env=TOKENS) as srv:
        too_many = httpx.post(srv.url + "/v1/calls", json={"calls": sleeps(7, 0)}, headers=auth(TOKEN_A))
        assert too_many.status_code == 429, too_many.text
        message = too_many.json()["error"]["message"]
        assert "never admitted at once here: one token may hold at most 6" in message, message
        assert "limits.max_admitted_per_tenant" in message and "retry this batch" not in message
        fits = httpx.post(srv.url + "/v1/calls", json={"calls": sleeps(6, 0)}, headers=auth(TOKEN_A))
        assert fits.status_code == 200 and all(not r.is_error for r in decode_results(fits.content))

        async def through_the_client() -> list[Any]:
            from trainer_client.client.tool_client import ToolClient

            async with ToolClient(srv.url, token=TOKEN_A) as client:
                return await client.call_tools(
                    [Call(new_call_id(), "echo", {"text": str(i)}) for i in range(20)]
                )

        results = asyncio.run(through_the_client())
        assert [r.structured["text"] for r in results] == [str(i) for i in range(20)]
