"""τ²'s dual control and τ²'s NL-assertion judge with a real vLLM server as the model.

The simulated customer of a dual-control telecom task and τ²'s NL judge are SmolLM2-135M on
vLLM's OpenAI server (CPU build, from .venv-vllm), reached through a real tool server's ``llm``
tool. vLLM parses tool calls only with ``--enable-auto-tool-choice --tool-call-parser hermes``:
the package's shared server (``conftest.vllm_server``) is started with them. A 135M
model plays badly: these tests check the pipeline, not the score: the customer is asked with
the phone's tools, the tool calls it makes are run as the user's on the session's world and
judged by τ²'s verdict, and the NL judge's request reaches vLLM and its answer the verdict.
What the model did is printed (``pytest -s``). Skipped without .venv-vllm, as the package's
other tests (``TOOLFACTORY_REQUIRE_VLLM=1`` makes that a failure).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.envs.tau2.parity import Call, Trajectory, served
from tests.support.server import ServerProcess, running_server, server_config
from tools.data.environments import task_row
from tools.envs.pack import Pack
from tools.envs.tau2 import packs as tau2
from trainer_client.backends.models import load_tokenizer
from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
from trainer_client.backends.vllm_server import LocalVLLMServer
from trainer_client.client.tool_client import ToolClient
from trainer_client.rollout.core import RolloutConfig, RolloutCore, StopReason
from trainer_client.rollout.core import Trajectory as Rollout
from trainer_client.rollout.dataset import TaskRow

pytestmark = pytest.mark.timeout(2400)
ROAMING = "[mobile_data_issue]user_abroad_roaming_enabled_off[PERSONA:None]"


@pytest.fixture(scope="module")
def tool_server(vllm_server: LocalVLLMServer) -> Iterator[ServerProcess]:
    """The ``llm`` tool and τ²'s NL judge on vLLM; dual-control telecom and mock's actionless tasks."""
    llm = {"base_url": vllm_server.url + "/v1", "model": "smollm2", "max_tokens": 96, "timeout_s": 300}
    config = server_config(
        tools=[{"target": "tools.llm:LlmTool", "args": llm}],
        environments=[
            {
                "source": "tools.envs.tau2:pack",
                "arguments": {"domain": "telecom", "split": "small", "mode": "dual"},
            },
            {  # τ²'s domains share tool names (transfer_to_human_agents)
                "source": "tools.envs.tau2:pack",
                "prefix": "m_",
                "arguments": {"domain": "mock", "actionless": True, "nl_judge": llm},
            },
        ],
    )
    with running_server(config, startup_timeout_s=600) as server:
        yield server


@pytest.fixture(scope="module")
def telecom() -> Pack:
    return tau2.pack("telecom", split="small", mode="dual")


def test_the_llm_tool_returns_vllms_tool_calls(tool_server: ServerProcess, telecom: Pack) -> None:
    """A real model's tool call, parsed by vLLM, comes back from the ``llm`` tool as structured
    ``tool_calls``, and runs as the customer's on the session's phone."""
    schemas = [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
        }
        for t in telecom.tools
        if t.name == "toggle_roaming"
    ]
    call = '<tool_call>\n{"name": "toggle_roaming", "arguments": {}}\n</tool_call>'
    chat = [  # a few turns that show the format: greedy SmolLM2 follows them
        {"role": "system", "content": "You answer every request with one tool call, in the format shown."},
        {"role": "user", "content": "Turn data roaming on."},
        {"role": "assistant", "content": call},
        {"role": "user", "content": "Please turn data roaming on."},
        {"role": "assistant", "content": call},
        {"role": "user", "content": "Turn data roaming on, please."},
    ]

    async def ask() -> Any:
        async with ToolClient(tool_server.url) as client:
            return await client.call("llm", {"messages": chat, "tools": schemas})

    result = asyncio.run(ask())
    assert not result.is_error, result.error
    calls = result.structured.get("tool_calls") or []
    print(f"\nvLLM's answer with tools: text {result.text!r}, tool calls {calls}")
    assert [c["function"]["name"] for c in calls] == ["toggle_roaming"], result.structured
    # run it as the customer's call: the phone changes, τ²'s verdict sees it
    user_call = Call("toggle_roaming", json.loads(calls[0]["function"]["arguments"] or "{}"), "user")
    task = telecom.task(ROAMING)
    played = served(tool_server.url, telecom, task, Trajectory("vllm", [user_call], ["Done."]))
    assert played.score == 1.0 and played.components["benchmark_env_assertion"] == 1.0, played.details


def test_a_vllm_customer_with_the_phones_tools_plays_a_dual_control_task(
    tool_server: ServerProcess, telecom: Pack
) -> None:
    tokenizer = load_tokenizer("smollm2")
    task = TaskRow.from_row(
        task_row(telecom, telecom.task(ROAMING), split="test", index=0, user="simulated")
    ).task()
    agent = [
        "Hello! How can I help you today?",
        "Please turn on data roaming on your phone: call your toggle_roaming tool now.",
        "Could you check your status bar and tell me what it shows?",
        "Thank you. Is mobile data working now?",
    ]
    eos = tokenizer.eos_token_id
    turns = [ScriptedTurn(tokenizer(t, add_special_tokens=False)["input_ids"] + [eos]) for t in agent]

    async def run() -> Rollout:
        async with ToolClient(tool_server.url) as client:
            config = RolloutConfig(
                max_turns=len(agent),
                max_user_turns=len(agent),
                response_length=8192,
                max_obs_tokens=1024,
                verifier="tool_use",
                verifier_arguments={"mode": "eval"},
            )
            core = RolloutCore(tokenizer, ScriptedGenerator(turns), client, config, verifier=client)
            return await core.run(task)

    tr = asyncio.run(run())
    phone = {d["name"] for d in task.metadata["user_sim"]["tools"]}
    acted = [m for m in tr.messages if m.get("role") == "user" and m.get("tool_calls")]
    results = [m for m in tr.messages if m.get("role") == "tool" and m.get("requestor") == "user"]
    print(
        f"\nvLLM customer: stop {tr.stop_reason}, {len(acted)} tool-call turns, "
        f"{tr.metrics.get('user_calls', 0)} calls {[m.get('name') for m in results]}, "
        f"reward {tr.reward_score}, error {tr.error}"
    )
    for m in tr.messages[len(task.messages) :]:
        print(f"  {m['role']}: {str(m.get('content'))[:120]!r} {m.get('tool_calls') or ''}")
    # the pipeline: the customer was asked (with its tools: a request vLLM refused would end the
    # run as user_error), and whatever it said or did was scored by τ²'s verdict
    assert tr.stop_reason != StopReason.USER_ERROR or "tool calls" in (tr.error or ""), tr.error
    assert tr.metrics["user_turns"] >= 1 or tr.metrics.get("user_calls", 0) >= 1
    assert tr.reward_score is not None and "benchmark" in tr.reward_components, tr.metrics
    # each call of the customer's reached the server as the user's: a phone tool ran (no refusal)
    for message in results:
        if message.get("name") in phone:
            assert "the agent cannot call it" not in message["content"], message


def test_tau2s_nl_judge_asks_vllm(tool_server: ServerProcess) -> None:
    mock = tau2.pack("mock", actionless=True)
    task = mock.task("create_task_1_nl_eval")
    create = Call("create_task", {"user_id": "user_1", "title": "Important Meeting"})
    played = served(tool_server.url, mock, task, Trajectory("vllm", [create], ["Created. Great work!"]), "m_")
    reason = played.details["benchmark"]["reason"] or ""
    print(
        f"\nτ²'s NL judge on vLLM: nl_assertion {played.components.get('benchmark_nl_assertion')}: {reason}"
    )
    assert played.score == 1.0  # τ²'s own reward for this task does not include its NL assertions
    assert played.components["benchmark_nl_assertion"] in (0.0, 1.0)
    assert "not judged" not in reason  # the judge was asked; a 135M model may well not answer in JSON
    assert "unavailable" not in reason, reason
