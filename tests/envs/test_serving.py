"""Environment packs behind a real server: per-session worlds, task binding, MCP, the reward.

One server (uvicorn subprocess on loopback, two bearer tokens = two tenants) serves the
test shop pack (tests/support/env_pack.py) from its source, and the same pack dumped
as a directory under another toolset with prefixed tool names.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from protocol import Result, VerifyResult, decode_results, decode_verify_results
from tests.support import env_pack
from tests.support.server import ServerProcess, running_server, server_config
from tools.envs.pack import dump_pack

TOKEN_A = "tenant-a-" + "a" * 24
TOKEN_B = "tenant-b-" + "b" * 24
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = dump_pack(
        env_pack.pack(pack_id="shop_dir"),
        tmp_path_factory.mktemp("pack"),
        tools_module="tests.support.env_pack",
    )
    config = server_config(
        environments=[
            {"source": "tests.support.env_pack:pack"},
            {"path": str(directory), "toolset": "shop2", "prefix": "s2_"},
        ]
    )
    with running_server(config, env={"TOOLFACTORY_TOKENS": f"{TOKEN_A},{TOKEN_B}"}) as srv:
        yield srv


def headers(token: str = TOKEN_A) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def call(
    srv: ServerProcess, name: str, arguments: dict[str, Any], session: str | None, token: str = TOKEN_A
) -> Result:
    body = {
        "calls": [{"call_id": uuid.uuid4().hex, "name": name, "arguments": arguments, "session": session}]
    }
    response = httpx.post(srv.url + "/v1/calls", json=body, headers=headers(token), timeout=30)
    assert response.status_code == 200, response.text
    return decode_results(response.content)[0]


def open_session(srv: ServerProcess, body: dict[str, Any], token: str = TOKEN_A) -> httpx.Response:
    return httpx.post(srv.url + "/v1/sessions", json=body, headers=headers(token), timeout=30)


def bound(srv: ServerProcess, pack: str, task: str) -> str:
    """A new session of tenant A bound to ``task`` of ``pack``."""
    session = sid()
    opened = open_session(srv, {"session": session, "environment": {"pack": pack, "task": task}})
    assert opened.status_code == 201, opened.text
    return session


def release(srv: ServerProcess, session: str, token: str = TOKEN_A) -> httpx.Response:
    return httpx.delete(f"{srv.url}/v1/sessions/{session}", headers=headers(token), timeout=30)


def gauge(srv: ServerProcess, name: str) -> float:
    text = httpx.get(srv.url + "/metrics", headers=headers(), timeout=30).text
    for line in text.splitlines():
        if line.startswith("toolfactory_tool_gauge") and f'name="{name}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no gauge {name} in /metrics")


def sid() -> str:
    return f"s-{uuid.uuid4().hex}"


def test_pack_tools_are_served_with_their_own_schemas(server: ServerProcess) -> None:
    listed = httpx.get(server.url + "/v1/tools", params={"toolset": "shop"}, headers=headers()).json()[
        "tools"
    ]
    by_name = {t["name"]: t for t in listed}
    assert set(by_name) == {t.name for t in env_pack.TOOLS}
    for tool in env_pack.TOOLS:
        assert by_name[tool.name]["inputSchema"] == tool.input_schema
        assert by_name[tool.name]["description"] == tool.description
        assert by_name[tool.name]["_meta"]["toolfactory"]["stateful"] is True
    assert by_name["cancel_order"]["_meta"]["toolfactory"]["idempotent"] is False  # a write
    spec = httpx.get(server.url + "/openapi.json", headers=headers()).json()
    body = spec["paths"]["/v1/sessions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["environment"]["required"] == ["pack", "task"]
    second = httpx.get(server.url + "/v1/tools", params={"toolset": "shop2"}, headers=headers()).json()[
        "tools"
    ]
    assert sorted(t["name"] for t in second) == sorted("s2_" + t.name for t in env_pack.TOOLS)


def test_two_sessions_do_not_see_each_others_writes(server: ServerProcess) -> None:
    a, b = sid(), sid()
    cancelled = call(server, "cancel_order", {"order_id": "o1", "reason": "changed my mind"}, a)
    assert not cancelled.is_error, cancelled.text
    assert cancelled.structured["status"] == "cancelled"
    assert call(server, "get_order", {"order_id": "o1"}, b).structured["status"] == "pending"
    assert call(server, "get_order", {"order_id": "o1"}, a).structured["status"] == "cancelled"
    deleted = call(server, "delete_order", {"order_id": "o3"}, b)
    assert deleted.text == "deleted o3"
    assert call(server, "get_order", {"order_id": "o3"}, b).is_error
    assert call(server, "get_order", {"order_id": "o3"}, a).structured["status"] == "pending"
    # The directory pack under its prefixed names is a world of its own.
    assert call(server, "s2_get_order", {"order_id": "o1"}, a).structured["status"] == "pending"


def test_a_call_without_a_session_is_refused(server: ServerProcess) -> None:
    result = call(server, "get_order", {"order_id": "o1"}, None)
    assert result.is_error and result.error is not None
    assert result.error.kind.value == "bad_request"
    assert "session" in result.error.message
    # Also the way for an MCP client that cannot set _meta: the session in the URL.
    assert "/mcp/shop/s/<session>" in result.error.message


def test_a_task_bound_urls_tool_list_offers_only_what_the_task_allows(server: ServerProcess) -> None:
    """Before: ``/mcp/shop/s/<session>`` listed every tool of the pack, and the ones the
    session's task refuses failed when called."""
    session = bound(server, "shop", "cancel_patched")  # its task allows get_order, cancel_order
    unbound = sid()

    async def listed(path: str) -> set[str]:
        async with httpx2.AsyncClient(headers=headers()) as http:
            transport = streamable_http_client(server.url + path, http_client=http)
            async with Client(transport, mode="2026-07-28") as client:
                return {tool.name for tool in (await client.list_tools()).tools}

    everything = {t.name for t in env_pack.TOOLS}
    assert anyio.run(listed, f"/mcp/shop/s/{session}") == {"get_order", "cancel_order"}
    assert anyio.run(listed, "/mcp/shop") == everything
    assert anyio.run(listed, f"/mcp/shop/s/{unbound}") == everything  # no task: no limit
    refused = call(server, "delete_order", {"order_id": "o3"}, session)
    assert refused.error is not None and "not available in this task" in refused.error.message
    release(server, session)


def test_a_released_sessions_world_is_freed_and_its_id_unknown(server: ServerProcess) -> None:
    session = sid()
    before = gauge(server, "worlds_live")
    assert not call(server, "cancel_order", {"order_id": "o1"}, session).is_error
    assert call(server, "cancel_order", {"order_id": "o1"}, session).is_error  # a ToolError holds no world
    assert gauge(server, "worlds_live") == before + 1
    assert release(server, session).status_code == 200
    deadline = time.monotonic() + 10
    while gauge(server, "worlds_live") != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gauge(server, "worlds_live") == before  # the world object is gone, not just unlinked
    late = call(server, "get_order", {"order_id": "o1"}, session)
    assert late.is_error and late.error is not None and late.error.kind.value == "unknown_session"


def test_a_bound_session_starts_from_the_tasks_patched_state(server: ServerProcess) -> None:
    session = sid()
    environment = {"pack": "shop", "task": "cancel_patched"}
    opened = open_session(server, {"session": session, "environment": environment})
    assert opened.status_code == 201, opened.text
    assert opened.json()["environment"] == environment
    assert (
        open_session(server, {"session": session, "environment": environment}).status_code == 201
    )  # again: same
    assert call(server, "get_order", {"order_id": "o9"}, session).structured["total"] == 99  # patched in
    assert call(server, "get_order", {"order_id": "o3"}, session).is_error  # patched out
    assert not call(server, "cancel_order", {"order_id": "o9"}, session).is_error
    # The task exposes get_order and cancel_order only.
    hidden = call(server, "get_user", {"user_id": "u1"}, session)
    assert hidden.is_error and hidden.error is not None and hidden.error.kind.value == "unknown_tool"
    assert "not available in this task" in hidden.error.message
    unbound = sid()
    assert call(server, "get_order", {"order_id": "o9"}, unbound).is_error  # the pack's initial state
    assert not call(server, "get_order", {"order_id": "o3"}, unbound).is_error
    # The binding belongs to tenant A: to tenant B the id is someone else's.
    foreign = call(server, "get_order", {"order_id": "o9"}, session, token=TOKEN_B)
    assert foreign.is_error and foreign.error is not None and foreign.error.kind.value == "unknown_session"


def test_bad_bindings_get_clear_errors(server: ServerProcess) -> None:
    unknown_pack = open_session(server, {"environment": {"pack": "nope", "task": "look"}})
    assert unknown_pack.status_code == 404
    assert "no environment pack 'nope'" in unknown_pack.text and "shop" in unknown_pack.text
    unknown_task = open_session(server, {"environment": {"pack": "shop", "task": "nope"}})
    assert unknown_task.status_code == 404 and "has no task 'nope'" in unknown_task.text
    malformed = open_session(server, {"environment": {"pack": "shop"}})
    assert malformed.status_code == 400 and '"task"' in malformed.json()["error"]["message"]

    session = bound(server, "shop", "look")
    other = open_session(
        server, {"session": session, "environment": {"pack": "shop", "task": "cancel_patched"}}
    )
    assert other.status_code == 409 and "already plays task 'look'" in other.text
    started = sid()
    assert not call(server, "get_order", {"order_id": "o1"}, started).is_error
    late = open_session(server, {"session": started, "environment": {"pack": "shop", "task": "look"}})
    assert late.status_code == 409 and "before its first call" in late.text


def test_tool_errors_and_bad_arguments_are_results(server: ServerProcess) -> None:
    session = sid()
    refused = call(server, "cancel_order", {"order_id": "o2"}, session)  # shipped
    assert refused.is_error and refused.error is not None
    assert refused.error.kind.value == "tool_error" and "only pending orders" in refused.error.message
    missing = call(server, "get_order", {}, session)
    assert missing.error is not None and missing.error.kind.value == "invalid_arguments"
    assert "order_id" in missing.error.message
    extra = call(server, "get_order", {"order_id": "o1", "verbose": True}, session)
    assert extra.error is not None and extra.error.kind.value == "invalid_arguments"
    assert "verbose" in extra.error.message


def test_the_pack_over_mcp_with_the_official_client(server: ServerProcess) -> None:
    session = sid()

    async def scenario() -> tuple[Any, ...]:
        async with httpx2.AsyncClient(headers=headers()) as http:
            transport = streamable_http_client(server.url + "/mcp/shop", http_client=http)
            async with Client(transport, mode="2026-07-28") as client:
                tools = (await client.list_tools()).tools
                bind = {
                    "toolfactory/session": session,
                    "toolfactory/environment": {"pack": "shop", "task": "cancel_patched"},
                }
                first = await client.call_tool("get_order", {"order_id": "o9"}, meta=bind)
                cancel = await client.call_tool(
                    "cancel_order", {"order_id": "o9"}, meta={"toolfactory/session": session}
                )
                again = await client.call_tool("cancel_order", {"order_id": "o9"}, meta=bind)
                rebind = await client.call_tool(
                    "get_order",
                    {"order_id": "o1"},
                    meta={
                        "toolfactory/session": session,
                        "toolfactory/environment": {"pack": "shop", "task": "look"},
                    },
                )
                no_session = await client.call_tool("get_order", {"order_id": "o1"})
                return tools, first, cancel, again, rebind, no_session

    tools, first, cancel, again, rebind, no_session = anyio.run(scenario)
    schemas = {t.name: t.input_schema for t in tools}
    assert schemas == {t.name: t.input_schema for t in env_pack.TOOLS}
    assert not first.is_error and first.structured_content["total"] == 99  # bound: the patched state
    assert not cancel.is_error and cancel.structured_content["status"] == "cancelled"
    assert again.is_error and "only pending orders" in again.content[0].text  # the same world
    assert rebind.is_error and "already plays task 'cancel_patched'" in rebind.content[0].text
    assert no_session.is_error and no_session.meta["toolfactory"]["error_kind"] == "bad_request"


def test_the_directory_pack_round_trips(tmp_path: Path) -> None:
    from tools.envs.pack import load_pack

    original = env_pack.pack()
    loaded = load_pack(dump_pack(original, tmp_path, tools_module="tests.support.env_pack"))
    assert [t.to_dict() for t in loaded.tasks] == [t.to_dict() for t in original.tasks]
    assert loaded.initial_state == original.initial_state and loaded.policy == original.policy


def verify(srv: ServerProcess, request: dict[str, Any]) -> VerifyResult:
    body = {"requests": [{"verifier": "tool_use", "response": "", **request}]}
    response = httpx.post(srv.url + "/v1/verify", json=body, headers=headers(), timeout=30)
    assert response.status_code == 200, response.text
    return decode_verify_results(response.content)[0]


def played(calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """A trajectory's messages: the prompt, one assistant turn per call and its tool message."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "please"}]
    for name, arguments in calls:
        text = json.dumps({"name": name, "arguments": arguments})
        messages += [
            {"role": "assistant", "content": f"<tool_call>{text}</tool_call>"},
            {"role": "tool", "name": name, "content": "ok"},
        ]
    return messages + [{"role": "assistant", "content": "Done."}]


def test_the_tool_use_verifier_scores_the_sessions_world(server: ServerProcess) -> None:
    gold = [("get_user", {"user_id": "u1"}), ("cancel_order", {"order_id": "o1"})]
    truth = {"pack": "shop", "task": "user_then_cancel"}
    session, idle = bound(server, **truth), bound(server, **truth)
    for name, arguments in gold:
        assert not call(server, name, arguments, session).is_error
    request = {"ground_truth": truth, "messages": played(gold), "response_start": 1}
    solved = verify(server, {**request, "session": session, "arguments": {"mode": "eval"}})
    assert not solved.is_error, solved.error
    assert solved.score == 1.0 and solved.components["state"] == 1.0 and solved.components["calls"] == 1.0
    weighted = verify(server, {**request, "session": session, "arguments": {"weights": {"state": 1.0}}})
    assert weighted.score == 1.0
    # A session that made no call is scored on the task's starting world: nothing done.
    nothing = verify(
        server, {**request, "messages": played([]), "session": idle, "arguments": {"mode": "eval"}}
    )
    assert not nothing.is_error and nothing.score == 0.0 and nothing.components["state"] == 0.0
    # Without a session there is no world to check.
    no_world = verify(server, {**request, "arguments": {"mode": "eval"}})
    assert not no_world.is_error and no_world.components["state"] == 0.0


def test_the_tool_use_verifier_in_a_patched_task_and_behind_a_prefix(server: ServerProcess) -> None:
    truth = {"pack": "shop_dir", "task": "cancel_patched"}
    session = bound(server, **truth)
    assert not call(server, "s2_cancel_order", {"order_id": "o9"}, session).is_error
    messages = played([("s2_cancel_order", {"order_id": "o9"})])
    result = verify(
        server, {"ground_truth": truth, "messages": messages, "response_start": 1, "session": session}
    )
    assert not result.is_error, result.error
    assert result.components["state"] == 1.0
    assert result.components["format"] == 1.0 and result.components["schema"] == 1.0  # names unprefixed


def test_the_tool_use_verifier_refuses_what_it_cannot_score(server: ServerProcess) -> None:
    session = bound(server, "shop", "look")
    cases = {
        "played task 'look'": {
            "ground_truth": {"pack": "shop", "task": "user_then_cancel"},
            "session": session,
        },
        "no environment pack 'mall'": {"ground_truth": {"pack": "mall", "task": "look"}},
        "ground_truth must be": {"ground_truth": "shop/look"},
        "mode must be one of": {
            "ground_truth": {"pack": "shop", "task": "look"},
            "arguments": {"mode": "exam"},
        },
    }
    for expected, request in cases.items():
        result = verify(server, request)
        assert result.is_error and result.error is not None, expected
        assert result.error.kind.value == "invalid_arguments" and expected in result.error.message
    unbound = sid()
    assert not call(server, "get_order", {"order_id": "o1"}, unbound).is_error
    patched = verify(server, {"ground_truth": {"pack": "shop", "task": "cancel_patched"}, "session": unbound})
    assert patched.is_error and patched.error is not None and "bind the session" in patched.error.message


def roll_out(srv: ServerProcess, task: Any, turns: list[str], **config: Any) -> Any:
    """``task`` rolled out by the rollout core: a scripted model (SmolLM2's tokenizer) says
    ``turns``, the batched client calls the server, and the server's verifier scores it."""
    from trainer_client.backends.models import load_tokenizer
    from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
    from trainer_client.client.tool_client import ToolClient
    from trainer_client.rollout.core import RolloutConfig, RolloutCore

    tokenizer = load_tokenizer("smollm2")
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    script = [ScriptedTurn(tokenizer.encode(t, add_special_tokens=False) + [eos]) for t in turns]
    generator = ScriptedGenerator(lambda prompt_ids: script, tokenizer=tokenizer, eos_token_ids=[eos])

    async def run() -> Any:
        async with ToolClient(srv.url, token=TOKEN_A) as client:
            core = RolloutCore(tokenizer, generator, client, RolloutConfig(**config), verifier=client)
            return await core.run(task)

    return anyio.run(run)


def test_a_rollout_binds_its_session_to_the_rows_task_and_is_scored_on_its_world(
    server: ServerProcess,
) -> None:
    """The trainer's side: a dataset row of a pack task, rolled out by the rollout core with a
    scripted model through the batched client, plays the task's patched world and is scored there."""
    from tools.data.environments import build_rows
    from trainer_client.rollout.core import StopReason
    from trainer_client.rollout.dataset import TaskRow

    rows = build_rows(env_pack.pack(), test_fraction=0.0)["train"]
    task = TaskRow.from_row(next(r for r in rows if r["extra_info"]["task"] == "cancel_patched")).task()
    turns = [
        '<tool_call>{"name": "get_order", "arguments": {"order_id": "o9"}}</tool_call>',
        '<tool_call>{"name": "cancel_order", "arguments": {"order_id": </tool_call>',
        '<tool_call>{"name": "cancel_order", "arguments": {"order_id": "o9"}}</tool_call>',
        "<answer>Order o9 is cancelled.</answer>",
    ]
    trajectory = roll_out(server, task, turns, max_turns=5, verifier_arguments={"mode": "eval"})
    assert trajectory.error is None and trajectory.stop_reason == StopReason.ANSWER
    tool_messages = [m for m in trajectory.messages if m["role"] == "tool"]
    assert '"total":99' in tool_messages[0]["content"]  # the task's patched world
    assert tool_messages[1]["error"] == "parse"  # turn two's call is not JSON
    assert '"status":"cancelled"' in tool_messages[2]["content"]
    assert trajectory.reward_score == 1.0  # eval: calls, state and answer all right
    assert trajectory.reward_components["format"] < 1.0  # one attempt did not parse
    late = call(server, "get_order", {"order_id": "o9"}, trajectory.session_id)
    assert late.error is not None and late.error.kind.value == "unknown_session"  # released


def test_a_rollout_of_an_unknown_task_ends_with_the_servers_error(server: ServerProcess) -> None:
    from trainer_client.rollout.core import StopReason, Task

    task = Task([{"role": "user", "content": "hi"}], ground_truth={"pack": "shop", "task": "gone"})
    text = '<tool_call>{"name": "get_order", "arguments": {"order_id": "o1"}}</tool_call>'
    trajectory = roll_out(server, task, [text, text])
    assert trajectory.stop_reason == StopReason.ERROR
    assert trajectory.error is not None and "has no task 'gone'" in trajectory.error


def test_a_sessions_calls_in_one_batch_run_in_order(server: ServerProcess) -> None:
    session = sid()
    steps = [
        ("cancel_order", {"order_id": "o1"}),
        ("get_order", {"order_id": "o1"}),
        ("delete_order", {"order_id": "o1"}),
        ("get_order", {"order_id": "o1"}),
    ]
    calls = [
        {"call_id": uuid.uuid4().hex, "name": name, "arguments": arguments, "session": session}
        for name, arguments in steps
    ]
    others = [  # another session's calls in the same POST run beside them, in their own world
        {"call_id": uuid.uuid4().hex, "name": "get_order", "arguments": {"order_id": "o1"}, "session": sid()}
        for _ in range(4)
    ]
    response = httpx.post(
        server.url + "/v1/calls", json={"calls": calls + others}, headers=headers(), timeout=30
    )
    results = decode_results(response.content)
    assert results[0].structured["status"] == "cancelled"
    assert results[1].structured["status"] == "cancelled"
    assert results[2].text == "deleted o1"
    assert results[3].is_error and "no order 'o1'" in results[3].text
    assert all(r.structured["status"] == "pending" for r in results[4:])
