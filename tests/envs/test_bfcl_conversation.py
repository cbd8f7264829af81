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
from tools.envs import bfcl  # noqa: E402
from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn  # noqa: E402
from trainer_client.client import ToolClient  # noqa: E402
from trainer_client.dataset import TaskRow  # noqa: E402
from trainer_client.models import load_tokenizer  # noqa: E402
from trainer_client.rollout import RolloutConfig, RolloutCore, StopReason  # noqa: E402

TASK = "multi_turn_base_0"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    config = server_config(
        tools=[],  # BFCL's echo would clash with the test server's own
        environments=[{"source": "tools.envs.bfcl:pack", "arguments": {"category": "multi_turn_base"}}],
    )
    with running_server(config) as srv:
        yield srv


def scripted_turns(tokenizer: Any, pack: Any, task: Any, played_turns: int) -> list[ScriptedTurn]:
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
    eos = tokenizer.eos_token_id
    return [ScriptedTurn(tokenizer(t, add_special_tokens=False)["input_ids"] + [eos]) for t in texts]


def play(server: ServerProcess, played_turns: int | None = None) -> Any:
    pack = bfcl.pack("multi_turn_base")
    task = pack.task(TASK)
    row = TaskRow.from_row(task_row(pack, task, split="test", index=0))
    rollout_task = row.task()
    assert len(rollout_task.user_turns) == len(task.metadata["turns"]) > 0
    turns = len(task.metadata["turn_calls"]) if played_turns is None else played_turns
    tokenizer = load_tokenizer("smollm2")

    async def run() -> Any:
        async with ToolClient(server.url) as client:
            core = RolloutCore(
                tokenizer,
                ScriptedGenerator(scripted_turns(tokenizer, pack, task, turns)),
                client,
                RolloutConfig(
                    max_turns=40,
                    max_calls_per_turn=16,
                    response_length=8192,
                    max_obs_tokens=2048,
                    verifier="tool_use",
                    verifier_arguments={"mode": "eval"},
                ),
                verifier=client,
            )
            return await core.run(rollout_task)

    return asyncio.run(run()), task


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
