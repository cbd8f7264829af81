"""A trajectory cannot read its own gold, and a task's held-back tools are not named to it.

One real server (uvicorn subprocess on loopback) serves the test shop pack with two
tokens: ``FULL`` (every toolset: the trainer's, allowed to see gold, as the workbench
decides) and ``SCOPED`` (``shop+verifiers`` only). A second one serves BFCL's miss_func
category, whose tasks hold some tools back until a later turn.

* Verifiers (``verify_*``) are not callable as tools from a session, through
  ``/v1/calls`` or MCP: a trajectory's calls all carry its session, and the tool_use
  verifier's details name gold argument values.
* ``/v1/verify`` (and a verifier called as a tool outside a session) gives details with
  gold values only to a token allowed to see gold; the score is the same for both.
* A call to a tool the task does not offer, or to no tool at all, names no other tool
  inside a session.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from protocol import Result, VerifyRequest, decode_results
from tests.support import env_pack
from tests.support.require import require
from tests.support.server import ServerProcess, running_server, server_config
from tools.envs.pack import Complexity, EnvTask, Gold, GoldCall, Pack, PackInfo
from tools.verifiers.tool_use.reward import score

FULL = "gold-full-" + "f" * 24
SCOPED = "gold-scoped-" + "s" * 24
TRUTH = {"pack": "shop", "task": "user_then_cancel"}  # gold: get_user u1, then cancel_order o1
MISS = "multi_turn_miss_func_0"  # `sort` is held back until the user's third later turn
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    config = server_config(
        environments=[{"source": "tests.support.env_pack:pack"}],
        verifiers=[{"target": "tools.verifiers.match:exact_match"}],
    )
    tokens = f"{FULL},{SCOPED}:shop+verifiers"
    with running_server(config, env={"TOOLFACTORY_TOKENS": tokens}) as srv:
        yield srv


def headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def bound(srv: ServerProcess, token: str, pack: str, task: str) -> str:
    session = f"s-{uuid.uuid4().hex}"
    body = {"session": session, "environment": {"pack": pack, "task": task}}
    opened = httpx.post(srv.url + "/v1/sessions", json=body, headers=headers(token), timeout=60)
    assert opened.status_code == 201, opened.text
    return session


def post_call(
    srv: ServerProcess, name: str, arguments: dict[str, Any], session: str | None, token: str = FULL
) -> tuple[Result, str]:
    """One call on /v1/calls: its result, and the whole answer's text (to search for leaks)."""
    body = {
        "calls": [{"call_id": uuid.uuid4().hex, "name": name, "arguments": arguments, "session": session}]
    }
    response = httpx.post(srv.url + "/v1/calls", json=body, headers=headers(token), timeout=60)
    assert response.status_code == 200, response.text
    return decode_results(response.content)[0], response.text


def played(calls: list[tuple[str, dict[str, Any]]], answer: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "please"}]
    for name, arguments in calls:
        text = json.dumps({"name": name, "arguments": arguments})
        messages += [
            {"role": "assistant", "content": f"<tool_call>{text}</tool_call>"},
            {"role": "tool", "name": name, "content": "ok"},
        ]
    return messages + [{"role": "assistant", "content": f"<answer>{answer}</answer>"}]


# A trajectory of user_then_cancel that cancels the wrong order (o3 is pending too).
WRONG = [("get_user", {"user_id": "u1"}), ("cancel_order", {"order_id": "o3"})]


def play_wrong(srv: ServerProcess, token: str) -> str:
    session = bound(srv, token, **TRUTH)
    for name, arguments in WRONG:
        result, _ = post_call(srv, name, arguments, session, token)
        assert not result.is_error, result.error
    return session


def verify_request(session: str | None) -> dict[str, Any]:
    request = {"ground_truth": TRUTH, "messages": played(WRONG, "done"), "response_start": 1}
    return request if session is None else {**request, "session": session}


# --------------------------------------------------------------------------- verifiers in a session


def test_a_verifier_is_not_callable_as_a_tool_from_a_session(server: ServerProcess) -> None:
    session = play_wrong(server, FULL)
    # What a policy would emit: the verifier's name, forwarded in its trajectory's session.
    result, text = post_call(server, "verify_tool_use", verify_request(session), session)
    assert result.is_error and result.error is not None
    assert result.error.kind.value == "unauthorized", result.error
    assert "POST /v1/verify" in result.error.message
    assert "'o1'" not in text and "gold '" not in text  # no gold argument value
    # The same with the session only in the call (not in the verifier's arguments).
    bare, text = post_call(server, "verify_tool_use", verify_request(None), session)
    assert bare.is_error and bare.error is not None and bare.error.kind.value == "unauthorized"
    assert "'o1'" not in text
    # Every verifier, not only tool_use.
    other, _ = post_call(server, "verify_exact_match", {"response": "x", "ground_truth": "x"}, session)
    assert other.is_error and other.error is not None and other.error.kind.value == "unauthorized"


def test_a_verifier_is_not_callable_over_mcp_from_a_session(server: ServerProcess) -> None:
    session = play_wrong(server, FULL)

    async def scenario() -> Any:
        async with httpx2.AsyncClient(headers=headers(FULL), timeout=60) as http:
            transport = streamable_http_client(server.url + "/mcp/verifiers", http_client=http)
            async with Client(transport, mode="2026-07-28") as client:
                return await client.call_tool(
                    "verify_tool_use", verify_request(session), meta={"toolfactory/session": session}
                )

    answer = anyio.run(scenario)
    text = json.dumps(answer.model_dump(mode="json"))
    assert answer.is_error, text
    assert answer.meta["toolfactory"]["error_kind"] == "unauthorized", text
    assert "'o1'" not in text and "gold '" not in text


def test_outside_a_session_a_verifier_still_scores_as_a_tool(server: ServerProcess) -> None:
    """Documented use (an evaluation harness on /mcp/verifiers): no session on the call, the
    trajectory's session in the verifier's arguments. Gold only to a token allowed to see it."""
    session = play_wrong(server, FULL)
    full, full_text = post_call(server, "verify_tool_use", verify_request(session), None, FULL)
    assert not full.is_error, full.error
    assert "argument 'order_id' is 'o3', gold 'o1'" in full_text
    scoped_session = play_wrong(server, SCOPED)
    scoped, scoped_text = post_call(server, "verify_tool_use", verify_request(scoped_session), None, SCOPED)
    assert not scoped.is_error, scoped.error
    assert isinstance(full.structured, dict) and isinstance(scoped.structured, dict)
    assert scoped.structured["score"] == full.structured["score"]
    assert "'o1'" not in scoped_text and "gold '" not in scoped_text
    assert "gold_hidden" in scoped.structured["details"]


# --------------------------------------------------------------------------- /v1/verify and scoped tokens


def post_verify(srv: ServerProcess, request: dict[str, Any], token: str) -> tuple[dict[str, Any], str]:
    body = {"requests": [{"verifier": "tool_use", **request}]}
    response = httpx.post(srv.url + "/v1/verify", json=body, headers=headers(token), timeout=60)
    assert response.status_code == 200, response.text
    (result,) = response.json()["results"]
    assert not result["is_error"], result
    return result, response.text


def test_verify_gives_gold_details_only_to_a_token_allowed_to_see_gold(server: ServerProcess) -> None:
    full, full_text = post_verify(server, verify_request(play_wrong(server, FULL)), FULL)
    scoped, scoped_text = post_verify(server, verify_request(play_wrong(server, SCOPED)), SCOPED)
    # The same trajectory earns the same reward, whoever asks.
    assert scoped["score"] == full["score"] and scoped["components"] == full["components"]
    # The full token sees why: the gold's argument and the records the gold world changed.
    assert "argument 'order_id' is 'o3', gold 'o1'" in full_text
    assert ["orders", "o1"] in full["details"]["state"]["differences"]
    # The scoped one (the workbench refuses it gold with 403) sees no gold value.
    assert "'o1'" not in scoped_text and '"o1"' not in scoped_text and "gold '" not in scoped_text
    assert scoped["details"]["state"]["differences"] == len(full["details"]["state"]["differences"])
    assert "gold_hidden" in scoped["details"] and "gold_hidden" not in full["details"]
    # The gold answer of a task with one ("look": "shipped"), without a session.
    answer = {"ground_truth": {"pack": "shop", "task": "look"}, "messages": played([], "pending")}
    full, _ = post_verify(server, answer, FULL)
    scoped, scoped_text = post_verify(server, answer, SCOPED)
    assert full["details"]["answer"]["gold"] == "shipped"
    assert "shipped" not in scoped_text and "get_order" not in scoped_text  # the gold's tool too
    assert scoped["details"]["answer"] == {"answer": "pending", "tagged": True}


def test_the_hidden_details_hold_no_gold_value() -> None:
    """Every detail that carries gold (arguments, outputs, the answer, what to communicate,
    the gold world's records, the gold's tools) is left out by ``reveal_gold=False``."""
    task = EnvTask(
        "secret",
        [{"role": "user", "content": "I am u1; cancel my pending order."}],
        Gold(
            [
                GoldCall("get_user", {"user_id": "u1"}, id="who", output={"name": "Zyx-output"}),
                GoldCall("cancel_order", {"order_id": "o1"}, id="cancel", depends_on=["who"]),
                GoldCall("delete_order", {"order_id": "o3"}, id="drop"),
            ],
            answer="Qwerty-answer",
            communicate=["Plugh-words"],
        ),
        Complexity(scenario="multi_hop", gold_calls=3, depth=2, width=2, level=2),
    )
    pack = Pack(PackInfo("shop"), list(env_pack.TOOLS), env_pack.initial_state(), [task])
    world = pack.new_world(task)
    pack.call(world, "get_user", {"user_id": "u1"})  # solved? no: its output is not the gold's
    pack.call(world, "cancel_order", {"order_id": "o3"})  # the wrong order
    request = VerifyRequest(
        verifier="tool_use",
        ground_truth={"pack": "shop", "task": "secret"},
        messages=played([("get_user", {"user_id": "u1"}), ("cancel_order", {"order_id": "o3"})], "no"),
        response_start=1,
    )
    shown = score(pack, task, world, request)
    hidden = score(pack, task, world, request, reveal_gold=False)
    assert hidden.score == shown.score and hidden.components == shown.components
    shown_text, hidden_text = json.dumps(shown.details), json.dumps(hidden.details)
    for gold in ("Zyx-output", "Qwerty-answer", "Plugh-words", "'o1'", "delete_order", '["orders", "o1"]'):
        assert gold in shown_text, gold  # the test's premise: the full details carry it
        assert gold not in hidden_text, gold
    assert hidden.details["communicate_missing"] == 1


# --------------------------------------------------------------------------- tools held back


def test_a_tool_the_task_does_not_offer_is_refused_without_naming_others(server: ServerProcess) -> None:
    session = bound(server, FULL, "shop", "cancel_patched")  # offers get_order and cancel_order
    result, text = post_call(server, "get_user", {"user_id": "u1"}, session)
    assert result.is_error and result.error is not None and result.error.kind.value == "unknown_tool"
    assert "not available in this task" in result.error.message
    assert "get_order" not in text and "cancel_order" not in text
    # A name no server tool has: no suggestion inside a session (verifiers included)...
    typo, text = post_call(server, "get_ordr", {"order_id": "o9"}, session)
    assert typo.is_error and typo.error is not None and typo.error.kind.value == "unknown_tool"
    assert "get_order" not in text and "verify_" not in text
    # ...while a caller outside any session still gets a hint.
    hint, _ = post_call(server, "get_ordr", {"order_id": "o9"}, None)
    assert hint.error is not None and "get_order" in hint.error.message


@pytest.fixture(scope="module")
def miss_server() -> Iterator[ServerProcess]:
    require("bfcl_eval")
    config = server_config(
        tools=[],  # BFCL's echo would clash with the test server's own
        environments=[{"source": "tools.envs.bfcl:pack", "arguments": {"category": "multi_turn_miss_func"}}],
    )
    with running_server(config) as srv:
        yield srv


def test_bfcl_held_back_tools_are_never_named(miss_server: ServerProcess) -> None:
    session = f"s-{uuid.uuid4().hex}"
    body = {"session": session, "environment": {"pack": "bfcl_multi_turn_miss_func", "task": MISS}}
    opened = httpx.post(miss_server.url + "/v1/sessions", json=body, timeout=60)
    assert opened.status_code == 201, opened.text
    # `add` (a math function) is a pack tool this task does not offer at all.
    refused, text = post_call(miss_server, "add", {"a": 1, "b": 2}, session)
    assert refused.is_error and refused.error is not None and refused.error.kind.value == "unknown_tool"
    assert "not available in this task" in refused.error.message
    assert "sort" not in text and "pwd" not in text
    # A near miss of the held-back name is not answered with it, on /v1/calls or MCP.
    near, text = post_call(miss_server, "sor", {"file_name": "final_report.pdf"}, session)
    assert near.is_error and near.error is not None and "sort" not in text

    async def scenario() -> Any:
        async with httpx2.AsyncClient(timeout=60) as http:
            transport = streamable_http_client(
                miss_server.url + "/mcp/bfcl_multi_turn_miss_func", http_client=http
            )
            async with Client(transport, mode="2026-07-28") as client:
                return await client.call_tool(
                    "sor", {"file_name": "final_report.pdf"}, meta={"toolfactory/session": session}
                )

    answer = anyio.run(scenario)
    assert answer.is_error
    assert "sort" not in json.dumps(answer.model_dump(mode="json"))
