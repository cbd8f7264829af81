"""A BFCL multi-turn entry played as a conversation, end to end: the data row carries the
user's later turns, the rollout core splices each one in after the model answers the one
before, the calls run on a real server's session world, and the ``tool_use`` reward reads
the result. A model that plays the gold calls turn by turn scores 1.0; one that stops
after the first turn does not."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.require import require

require("bfcl_eval")

from tests.support.server import ServerProcess, running_server, server_config  # noqa: E402
from tools.data.environments import task_row  # noqa: E402
from tools.envs.bfcl import packs as bfcl  # noqa: E402
from trainer_client.backends.models import load_tokenizer  # noqa: E402
from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn  # noqa: E402
from trainer_client.client.tool_client import ToolClient  # noqa: E402
from trainer_client.rollout.core import RolloutConfig, RolloutCore, StopReason  # noqa: E402
from trainer_client.rollout.dataset import TaskRow  # noqa: E402

TASK = "multi_turn_base_0"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    config = server_config(
        tools=[],  # BFCL's echo would clash with the test server's own
        environments=[{"source": "tools.envs.bfcl:pack", "arguments": {"category": "multi_turn_base"}}],
    )
    with running_server(config) as srv:
        yield srv


def scripted_texts(task: Any, played_turns: int) -> list[str]:
    """Per user turn: one assistant turn with that turn's gold calls (if any; only in the
    first ``played_turns`` turns, after which the model just says it is done), then a reply."""
    by_id = {c.id: c for c in task.gold.calls}
    texts = []
    for number, ids in enumerate(task.metadata["turn_calls"]):
        calls = [by_id[i] for i in ids] if number < played_turns else []
        if calls:
            texts.append(
                "".join(
                    f"<tool_call>{json.dumps({'name': c.name, 'arguments': c.arguments})}</tool_call>"
                    for c in calls
                )
            )
        texts.append("Done.")
    return texts


def roll(server: ServerProcess, pack: Any, task_id: str, texts: list[str]) -> Any:
    """The task's data row played by a scripted model writing ``texts``, one per turn."""
    rollout_task = TaskRow.from_row(task_row(pack, pack.task(task_id), split="test", index=0)).task()
    tokenizer = load_tokenizer("smollm2")
    eos = tokenizer.eos_token_id
    script = [ScriptedTurn(tokenizer(t, add_special_tokens=False)["input_ids"] + [eos]) for t in texts]

    async def run() -> Any:
        async with ToolClient(server.url) as client:
            config = RolloutConfig(
                max_turns=40,
                max_calls_per_turn=16,
                response_length=8192,
                max_obs_tokens=2048,
                verifier="tool_use",
                verifier_arguments={"mode": "eval"},
            )
            core = RolloutCore(tokenizer, ScriptedGenerator(script), client, config, verifier=client)
            return await core.run(rollout_task)

    return asyncio.run(run())


def play(server: ServerProcess, played_turns: int | None = None) -> Any:
    pack = bfcl.pack("multi_turn_base")
    task = pack.task(TASK)
    assert len(task.metadata["turns"]) > 0
    turns = len(task.metadata["turn_calls"]) if played_turns is None else played_turns
    return roll(server, pack, TASK, scripted_texts(task, turns)), task


def test_the_gold_played_turn_by_turn_scores_one(server: ServerProcess) -> None:
    tr, task = play(server)
    assert tr.error is None, tr.error
    assert tr.metrics["user_turns"] == len(task.metadata["turns"])
    assert tr.metrics["calls"] == len(task.gold.calls) and tr.metrics["tool_errors"] == 0
    said = [m["content"] for m in tr.messages if m["role"] == "user"]
    assert said[-len(task.metadata["turns"]) :] == [turn[0]["content"] for turn in task.metadata["turns"]]
    assert tr.stop_reason == StopReason.EOS
    assert tr.reward_score == 1.0, tr.reward_components


def test_stopping_after_the_first_turn_is_not_a_solution(server: ServerProcess) -> None:
    tr, task = play(server, played_turns=1)
    assert tr.error is None, tr.error
    assert tr.metrics["user_turns"] == len(task.metadata["turns"])  # every request was heard...
    assert 0 < tr.metrics["calls"] < len(task.gold.calls)  # ...but only the first was acted on
    assert tr.reward_score is not None and tr.reward_score < 1.0


# --------------------------------------------------------------------------- missed functions

MISS = "multi_turn_miss_func_0"  # `sort` is held back until the user's third later turn


@pytest.fixture(scope="module")
def miss_server() -> Iterator[ServerProcess]:
    config = server_config(
        tools=[],
        environments=[{"source": "tools.envs.bfcl:pack", "arguments": {"category": "multi_turn_miss_func"}}],
    )
    with running_server(config) as srv:
        yield srv


@pytest.fixture(scope="module")
def miss_pack() -> Any:
    return bfcl.pack("multi_turn_miss_func")


def names(schemas: list[dict[str, Any]]) -> set[str]:
    return {s["function"]["name"] for s in schemas}


def test_a_missed_function_is_shown_only_from_its_turn(miss_pack: Any) -> None:
    task = miss_pack.task(MISS)
    assert task.metadata["tools_added"] == {"3": ["sort"]} and "sort" in task.tools
    row = task_row(miss_pack, task, split="test", index=0)
    rollout_task = TaskRow.from_row(row).task()
    assert "sort" not in names(rollout_task.tools or [])  # the prompt's tool list lacks it
    assert names(rollout_task.tools or []) == set(task.tools) - {"sort"}
    assert [names(turn) for turn in rollout_task.new_tools] == [set(), set(), {"sort"}, set()]
    # a task without missed functions keeps every tool from the start and no new_tools
    base = bfcl.pack("multi_turn_base").task(TASK)
    assert (
        "new_tools" not in task_row(bfcl.pack("multi_turn_base"), base, split="test", index=0)["extra_info"]
    )


def test_the_gold_with_a_missed_function_scores_one(miss_server: ServerProcess, miss_pack: Any) -> None:
    task = miss_pack.task(MISS)
    tr = roll(miss_server, miss_pack, MISS, scripted_texts(task, 99))
    tokenizer = load_tokenizer("smollm2")
    assert tr.error is None, tr.error
    assert tr.metrics["refused_calls"] == 0 and tr.metrics["tool_errors"] == 0
    assert tr.metrics["calls"] == len(task.gold.calls)
    # the turn that adds `sort` announces it, as observation tokens (mask 0)
    reveal = [
        m for m in tr.messages if m["role"] == "user" and "Tools you can call from now on" in m["content"]
    ]
    assert len(reveal) == 1 and '"name":"sort"' in reveal[0]["content"]
    observed = tokenizer.decode([t for t, m in zip(tr.response_ids, tr.response_mask, strict=True) if m == 0])
    assert '"name":"sort"' in observed
    assert tr.reward_score == 1.0, tr.reward_components


def test_a_call_to_a_function_not_yet_shown_is_refused(miss_server: ServerProcess, miss_pack: Any) -> None:
    sort = '<tool_call>{"name": "sort", "arguments": {"file_name": "final_report.pdf"}}</tool_call>'
    pwd = '<tool_call>{"name": "pwd", "arguments": {}}</tool_call>'
    tr = roll(miss_server, miss_pack, MISS, [sort + pwd] + ["Done."] * 5)  # then each user turn
    assert tr.error is None, tr.error
    assert tr.metrics["refused_calls"] == 1 and tr.metrics["calls"] == 1  # only pwd reached the server
    results = [m for m in tr.messages if m["role"] == "tool"]
    assert results[0] == {
        "role": "tool",
        "name": "sort",
        "content": "Error (unknown_tool): no tool named 'sort' is available to you",
    }
    assert results[1]["name"] == "pwd" and not results[1]["content"].startswith("Error")
    # the reward counts the refused call as an invalid one
    assert tr.reward_components["schema"] == 0.5 and tr.reward_score < 1.0
