"""Multi-turn conversations (BFCL multi-turn): the user's later turns are spliced in, with
loss mask 0, each time the model ends a turn without calling a tool."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.trainer.conftest import InProcessInvoker
from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
from trainer_client.rollout.core import RolloutConfig, RolloutCore, StopReason, Task
from trainer_client.rollout.dataset import DatasetError, TaskRow

CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def turns(tokenizer: Any, *texts: str) -> list[ScriptedTurn]:
    eos = tokenizer.eos_token_id
    return [ScriptedTurn(tokenizer(t, add_special_tokens=False)["input_ids"] + [eos]) for t in texts]


def roll(tokenizer: Any, task: Task, *texts: str) -> Any:
    invoker = InProcessInvoker({"add": lambda a, b: a + b})
    core = RolloutCore(
        tokenizer, ScriptedGenerator(turns(tokenizer, *texts)), invoker, RolloutConfig(max_turns=8)
    )
    return asyncio.run(core.run(task)), invoker


def test_each_later_user_turn_follows_a_turn_without_calls(smol_tokenizer: Any) -> None:
    task = Task(
        [{"role": "user", "content": "Add 2 and 3."}],
        user_turns=[[{"role": "user", "content": "Now say hello."}], [{"role": "user", "content": "Bye."}]],
    )
    tr, invoker = roll(smol_tokenizer, task, CALL, "It is 5.", "Hello!", "Goodbye.")
    roles = [(m["role"], m["content"]) for m in tr.messages[1:]]
    assert roles == [
        ("assistant", CALL),
        ("tool", "5"),
        ("assistant", "It is 5."),
        ("user", "Now say hello."),
        ("assistant", "Hello!"),
        ("user", "Bye."),
        ("assistant", "Goodbye."),
    ]
    assert tr.stop_reason == StopReason.EOS and tr.metrics["user_turns"] == 2
    assert [c.name for c in invoker.calls] == ["add"]
    # the user's turns are observation tokens: in the response, with mask 0
    masked = smol_tokenizer.decode(
        [t for t, m in zip(tr.response_ids, tr.response_mask, strict=True) if m == 0]
    )
    assert "Now say hello." in masked and "Bye." in masked
    model = smol_tokenizer.decode(
        [t for t, m in zip(tr.response_ids, tr.response_mask, strict=True) if m == 1]
    )
    assert "Now say hello." not in model and "Goodbye." in model


def test_without_later_turns_the_first_reply_ends_the_trajectory(smol_tokenizer: Any) -> None:
    tr, _ = roll(
        smol_tokenizer, Task([{"role": "user", "content": "Add 2 and 3."}]), CALL, "It is 5.", "extra"
    )
    assert tr.messages[-1] == {"role": "assistant", "content": "It is 5."}
    assert tr.stop_reason == StopReason.EOS and tr.metrics["user_turns"] == 0


def test_dataset_rows_carry_the_later_turns() -> None:
    later = [[{"role": "user", "content": "Then sort it.", "tool_calls": None}]]  # parquet adds the None
    row = {"prompt": [{"role": "user", "content": "Find it."}], "extra_info": {"turns": later}}
    assert TaskRow.from_row(row).task().user_turns == [[{"role": "user", "content": "Then sort it."}]]
    bad = {"prompt": [{"role": "user", "content": "x"}], "extra_info": {"turns": ["not a turn"]}}
    with pytest.raises(DatasetError, match="'turns' must be a list of turns"):
        TaskRow.from_row(bad).task()
