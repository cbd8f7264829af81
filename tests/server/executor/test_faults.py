"""The executor's failure paths: every call ends as one result, and leaves nothing held behind.

Slots, admission counts, a session's turn and the in-flight entry of a call_id are given
back however a call ends: it fails, it is cancelled (even before it started), or its
cleanup fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from protocol import Call, decode_results
from tests.server.executor import fault_tools
from tests.support.server import ServerProcess, running_server, server_config
from tool_server.app import build_registry
from tool_server.config import config_from_dict
from tool_server.executor.executor import Caller, Executor
from tool_server.executor.records import canonical_arguments

TOOLS = [
    {"target": f"tests.server.executor.fault_tools:{name}", "toolsets": ["test"]}
    for name in (
        "cleanup_fails",
        "one_at_a_time",
        "held",
        "constant_result",
        "wide_structured",
        "jot",
        "jotting_agent",
        "shaped_oversize",
        "numpy_scores",
        "stuck",
        "buggy_check",
    )
]


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerProcess]:
    config = server_config()
    config["tools"] = [*config["tools"], *TOOLS]
    with running_server(config) as proc:
        yield proc


def make_executor(**limits: Any) -> Executor:
    config = config_from_dict(
        {"tools": [*TOOLS, {"target": "tools.testing:echo_async"}], "limits": limits}, environ={}
    )
    return Executor(build_registry(config), config)


async def settle() -> None:
    """Let every ready task run until all wait on something."""
    for _ in range(20):
        await asyncio.sleep(0)


def test_a_session_cleanup_that_raises_is_logged_not_a_500(srv):
    # A stateful tool called without a session gets a throwaway one, closed after the
    # call; a cleanup the tool left there that raises used to escape the executor.
    calls = [{"call_id": f"cleanup-{i}", "name": "cleanup_fails", "arguments": {}} for i in range(3)]
    response = httpx.post(srv.url + "/v1/calls", json={"calls": calls}, timeout=30)
    assert response.status_code == 200, response.text
    assert [r.text for r in decode_results(response.content)] == ["done"] * 3
    ready = httpx.get(srv.url + "/readyz", timeout=10).json()
    assert ready["in_flight"] == 0  # nothing stays admitted
    retried = httpx.post(srv.url + "/v1/calls", json={"calls": calls[:1]}, timeout=30)
    assert retried.status_code == 200 and decode_results(retried.content)[0].text == "done"


def gate(tag: str) -> asyncio.Event:
    return fault_tools.GATE.setdefault(tag, asyncio.Event())


async def test_a_call_cancelled_before_its_first_step_gives_back_all_it_held():
    executor = make_executor()
    await executor.start()
    first = asyncio.ensure_future(executor.run_one(Call("early", "held", {"tag": "early"}, session="s1")))
    await asyncio.sleep(0)  # run_one has created the call's task; the task has not run yet
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await settle()
    assert executor.admitted == 0
    gate("early").set()
    # The session's turn was passed on, and the call_id is free for a retry.
    later = await asyncio.wait_for(executor.run_one(Call("next", "held", {"tag": "early"}, session="s1")), 10)
    retry = await asyncio.wait_for(
        executor.run_one(Call("early", "held", {"tag": "early"}, session="s1")), 10
    )
    assert (later.text, retry.text) == ("early", "early")
    assert executor.admitted == 0


async def test_a_retry_that_joined_a_cancelled_call_gets_a_result_not_an_exception():
    executor = make_executor()
    await executor.start()
    first = asyncio.ensure_future(executor.run_one(Call("joined", "one_at_a_time", {"tag": "joined"})))
    await settle()  # the call runs, waiting at its gate
    retry = asyncio.ensure_future(executor.run_batch([Call("joined", "one_at_a_time", {"tag": "joined"})]))
    await settle()  # the retry has joined the running call
    first.cancel()
    (result,) = await asyncio.wait_for(retry, 10)
    assert result.call_id == "joined" and result.error.kind == "cancelled"
    assert executor.admitted == 0 and executor.running == 0
    gate("joined").set()
    again = await asyncio.wait_for(executor.run_one(Call("joined", "one_at_a_time", {"tag": "joined"})), 10)
    assert again.text == "joined"  # a cancelled outcome is not kept: the retry runs


async def test_calls_waiting_for_a_tools_own_limit_hold_no_global_slot():
    executor = make_executor(max_concurrency=2)
    await executor.start()
    calls = [Call(f"limited-{i}", "one_at_a_time", {"tag": "limited"}) for i in range(3)]
    limited = asyncio.ensure_future(executor.run_batch(calls))
    await settle()  # one runs (the tool allows one at a time), two wait for the tool
    other = asyncio.ensure_future(executor.run_one(Call("other", "echo_async", {"text": "hi"})))
    await settle()
    assert other.done() and other.result().structured == {"text": "hi"}
    gate("limited").set()
    assert [r.text for r in await asyncio.wait_for(limited, 10)] == ["limited"] * 3


async def test_a_tools_own_limit_is_shared_round_robin_across_tenants():
    executor = make_executor(max_concurrency=8)
    await executor.start()
    a, b = Caller(tenant="A"), Caller(tenant="B")
    fault_tools.STARTED.clear()
    backlog = asyncio.ensure_future(
        executor.run_batch([Call(f"a{i}", "one_at_a_time", {"tag": "shared"}) for i in range(4)], a)
    )
    await settle()
    late = asyncio.ensure_future(executor.run_batch([Call("b0", "one_at_a_time", {"tag": "shared"})], b))
    await settle()
    gate("shared").set()
    await asyncio.wait_for(asyncio.gather(backlog, late), 10)
    # Round-robin between the tenants waiting for the tool: B's call waited for the call
    # of A that held the tool and for A's next one (A was waiting first), not for A's backlog.
    assert fault_tools.STARTED == ["a0", "a1", "b0", "a2", "a3"]


async def test_a_result_object_the_tool_returns_again_keeps_each_calls_id():
    executor = make_executor()
    await executor.start()
    first = await executor.run_one(Call("first", "constant_result", {"n": 1}))
    second = await executor.run_one(Call("second", "constant_result", {"n": 2}))
    (replay,) = await executor.run_batch([Call("first", "constant_result", {"n": 1})])
    assert (first.call_id, second.call_id, replay.call_id) == ("first", "second", "first")
    assert fault_tools.CONSTANT.call_id == "whatever"  # the tool's own object is left as it was


def test_structured_output_over_its_limit_says_how_much_text_was_cut(srv):
    call = {"call_id": "wide", "name": "wide_structured", "arguments": {"items": 30_000}}
    response = httpx.post(srv.url + "/v1/calls", json={"calls": [call]}, timeout=30)
    (result,) = decode_results(response.content)
    total = len(orjson.dumps({"items": ["x" * 96] * 30_000}))  # ~3 MB: over max_structured_bytes
    assert result.structured == {
        "note": f"structured output of {total} bytes exceeded the limit and was dropped"
    }
    kept, marker = result.text.split("\n…[output truncated: ")
    assert len(kept) == 32768  # limits.max_output_chars
    assert marker == f"{total - 32768} of {total} characters omitted]"


MCP_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "MCP-Protocol-Version": "2026-07-28",
    "Mcp-Method": "tools/call",
    "Mcp-Name": "sleep",
}
MCP_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
    "toolfactory/call_id": "non-finite",
}


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_arguments_are_not_taken_for_null(srv, number):
    # MCP requests are parsed by pydantic, which reads NaN and Infinity; JSON has no
    # spelling for them, and encoded for the call's fingerprint they all read null.
    def call(seconds: str) -> dict[str, Any]:
        meta = {**MCP_META, "toolfactory/call_id": f"non-finite-{number}"}
        body = (
            '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "sleep", '
            f'"arguments": {{"seconds": {seconds}}}, "_meta": {orjson.dumps(meta).decode()}}}}}'
        )
        response = httpx.post(srv.url + "/mcp/test", content=body, headers=MCP_HEADERS, timeout=30)
        assert response.status_code == 200, response.text
        return response.json()["result"]

    first = call(number)
    assert first["isError"] and first["_meta"]["toolfactory"]["error_kind"] == "invalid_arguments"
    other = call("null")  # another call under the same id
    assert other["isError"] and other["_meta"]["toolfactory"]["error_kind"] == "bad_request"
    assert "already used" in other["content"][0]["text"]


def test_canonical_arguments_ignore_key_order_and_keep_every_value_apart():
    assert canonical_arguments({"b": 1, "a": {"y": "é", "x": [1.5]}}) == canonical_arguments(
        {"a": {"x": [1.5], "y": "é"}, "b": 1}
    )
    values = [None, float("nan"), float("inf"), float("-inf"), 0, 0.0, -0.0, "0", "é", "e\u0301"]
    keys = {canonical_arguments({"x": {"deep": [value]}}) for value in values}
    assert len(keys) == len(values)


async def test_inner_calls_of_a_call_without_a_session_share_its_throwaway_one():
    executor = make_executor()
    await executor.start()
    results = await executor.run_batch([Call(f"agent-{i}", "jotting_agent", {}) for i in range(3)])
    assert [r.structured["inner"] for r in results] == [{"notes": ["outer", "inner"]}] * 3
    # The throwaway sessions went with their calls: none was opened in the session store.
    assert len(executor.sessions) == 0
    with_session = await executor.run_one(Call("agent-s", "jotting_agent", {}, session="kept"))
    assert with_session.structured["inner"] == {"notes": ["outer", "inner"]} and len(executor.sessions) == 1


def test_a_result_the_tool_shaped_itself_is_held_to_the_output_limits(srv):
    # The same limits as for any other output (upstream servers' results go the same way).
    call = {"call_id": "shaped", "name": "shaped_oversize", "arguments": {"chars": 100_000}}
    response = httpx.post(srv.url + "/v1/calls", json={"calls": [call]}, timeout=30)
    assert response.status_code == 200, response.text
    (result,) = decode_results(response.content)
    assert result.call_id == "shaped" and not result.is_error
    assert result.text == "y" * 32768 + "\n…[output truncated: 67232 of 100000 characters omitted]"
    assert result.structured == {"note": "structured output was not JSON-serialisable and was dropped"}


@pytest.mark.parametrize("path", ["/v1/calls", "/mcp/test"])
def test_numpy_values_in_structured_output_reach_every_transport(srv, path):
    if path == "/v1/calls":
        call = {"call_id": "numpy", "name": "numpy_scores", "arguments": {"n": 3}}
        response = httpx.post(srv.url + path, json={"calls": [call]}, timeout=30)
        assert response.status_code == 200, response.text
        structured = decode_results(response.content)[0].structured
    else:
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "numpy_scores", "arguments": {"n": 3}, "_meta": MCP_META},
        }
        headers = {**MCP_HEADERS, "Mcp-Name": "numpy_scores"}
        response = httpx.post(srv.url + path, json=body, headers=headers, timeout=30)
        assert response.status_code == 200, response.text
        assert "result" in response.json(), response.text
        structured = response.json()["result"]["structuredContent"]
    assert structured == {"best": 1.0, "count": 3, "scores": [0.0, 0.5, 1.0]}


async def test_a_sessions_order_holds_past_a_call_that_fails_or_times_out():
    executor = make_executor()
    await executor.start()
    lines = ["a", "raise", None, "b"]  # None: the call that times out
    calls = [
        Call(f"order-{i}", "stuck", {}, session="ordered")
        if line is None
        else Call(f"order-{i}", "jot", {"line": line}, session="ordered")
        for i, line in enumerate(lines)
    ]
    results = await asyncio.wait_for(executor.run_batch(calls), 10)
    assert [r.error.kind if r.error else r.structured["notes"] for r in results] == [
        ["a"],
        "tool_error",
        "timeout",
        ["a", "b"],
    ]
    assert executor.admitted == 0


async def test_a_call_cancelled_while_waiting_for_its_turn_keeps_the_sessions_order():
    executor = make_executor()
    await executor.start()
    first = asyncio.ensure_future(executor.run_one(Call("turn-1", "held", {"tag": "turns"}, session="turns")))
    await settle()  # runs, holding the session's turn
    second = asyncio.ensure_future(executor.run_one(Call("turn-2", "jot", {"line": "two"}, session="turns")))
    third = asyncio.ensure_future(executor.run_one(Call("turn-3", "jot", {"line": "three"}, session="turns")))
    await settle()
    second.cancel()
    await settle()
    assert not third.done()  # the call before it was cancelled; the one before that still runs
    gate("turns").set()
    assert (await asyncio.wait_for(first, 10)).text == "turns"
    assert (await asyncio.wait_for(third, 10)).structured == {"notes": ["three"]}
    assert second.cancelled() and executor.admitted == 0


def test_an_argument_check_that_raises_is_the_tools_fault_not_a_500(srv):
    calls = [
        {"call_id": "check-bad", "name": "buggy_check", "arguments": {"picky": {"key": "other"}}},
        {"call_id": "check-ok", "name": "buggy_check", "arguments": {"picky": {"key": "ok"}}},
    ]
    response = httpx.post(srv.url + "/v1/calls", json={"calls": calls}, timeout=30)
    assert response.status_code == 200, response.text
    bad, ok = decode_results(response.content)
    assert bad.error.kind == "tool_error" and "KeyError" in bad.error.message
    assert ok.text == "ok"
