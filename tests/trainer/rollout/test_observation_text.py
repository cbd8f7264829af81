"""What a rollout shows the model besides a result's own content, and that it can be written.

A lone surrogate in a tool result (bytes decoded with ``surrogateescape``, or a JSON
``"\\udce9"`` escape from an MCP upstream) is escaped where the result becomes text, so
the messages, the splice and the rollout JSONL agree and orjson can write the record. A
turn of thousands of ``<tool_call>`` openers lists a few parse errors and counts the rest.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import orjson

import protocol
from tests.trainer.conftest import InProcessInvoker
from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
from trainer_client.rollout.core import RolloutConfig, RolloutCore
from trainer_client.rollout.dataset import TaskRow
from trainer_client.rollout.observations import MAX_LISTED, result_text
from trainer_client.rollout.records import read_records
from trainer_client.rollout.runner import run_and_write

EOS = 2  # <|im_end|> in SmolLM2
RAW = "caf\udce9 au lait"
SHOWN = "caf\\udce9 au lait"


def _ids(tok: Any, text: str) -> list[int]:
    return tok.backend_tokenizer.encode(text, add_special_tokens=False).ids


def _call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _core(tok: Any, turns: list[str], invoker: Any, **config: Any) -> RolloutCore:
    generator = ScriptedGenerator(
        [ScriptedTurn(_ids(tok, t)) for t in turns], tokenizer=tok, eos_token_ids=[EOS]
    )
    settings = {"max_turns": len(turns), "response_length": 4096, "max_obs_tokens": 4096, **config}
    return RolloutCore(tok, generator, invoker, RolloutConfig(**settings))


def test_a_lone_surrogate_in_a_result_is_escaped_and_the_rollout_is_written(
    smol_tokenizer: Any, tmp_path: Path
) -> None:
    invoker = InProcessInvoker({"raw": lambda: RAW, "data": lambda: {"name": RAW}})
    core = _core(smol_tokenizer, [_call("raw"), _call("data"), "<answer>ok</answer>"], invoker)
    row = TaskRow.from_row({"prompt": [{"role": "user", "content": "Read it."}]})
    out = tmp_path / "rollout.jsonl"
    records, _ = asyncio.run(run_and_write(core, [row], 1, out, verifier=None, concurrency=1, progress=False))
    (record,) = list(read_records(out))
    assert record["error"] is None and records[0]["messages"] == record["messages"]
    assert record["messages"][2]["content"] == SHOWN
    observation = record["segments"][1]["text"]
    assert SHOWN in observation and "\udce9" not in observation


def test_structured_output_with_a_lone_surrogate_is_shown_escaped() -> None:
    result = protocol.Result("c1", content=[], structured={"name": RAW, "n": 1})
    text = result_text(result)
    assert text == '{"name":"caf\\udce9 au lait","n":1}'  # as orjson writes JSON, surrogate escaped
    assert json.loads(text) == {"name": RAW, "n": 1} and orjson.dumps(text)


def test_a_run_of_openers_lists_a_few_parse_errors_and_counts_the_rest(smol_tokenizer: Any) -> None:
    openers = 2000
    invoker = InProcessInvoker({})
    core = _core(
        smol_tokenizer, ["<tool_call>" * openers, "<answer>ok</answer>"], invoker, response_length=16384
    )
    trajectory = asyncio.run(core.run(_task()))
    assert trajectory.error is None and trajectory.metrics["parse_errors"] == openers
    (parse,) = [m for m in trajectory.messages if m.get("error") == "parse"]
    lines = parse["content"].split("\n")
    assert len(lines) == MAX_LISTED + 1
    assert lines[0].startswith("Error: <tool_call> was opened again")
    assert lines[-1] == f"Error: {openers - MAX_LISTED} more tool calls did not parse"


def test_calls_over_the_turn_limit_name_a_few_and_count_the_rest(smol_tokenizer: Any) -> None:
    calls = 40
    invoker = InProcessInvoker({"echo": lambda text: text})
    turn = "".join(_call("echo", text=str(i)) for i in range(calls))
    core = _core(
        smol_tokenizer,
        [turn, "<answer>ok</answer>"],
        invoker,
        max_calls_per_turn=2,
        parser_options={"parallel_calls": True},
    )
    trajectory = asyncio.run(core.run(_task()))
    assert trajectory.metrics["dropped_calls"] == calls - 2
    dropped = [m for m in trajectory.messages if m["role"] == "tool"][-1]["content"]
    names = ", ".join(["echo"] * MAX_LISTED)
    more = calls - 2 - MAX_LISTED
    assert dropped == f"Error: not run ({names} and {more} more): at most 2 tool calls per turn are allowed"


def _task() -> Any:
    return TaskRow.from_row({"prompt": [{"role": "user", "content": "Go."}]}).task()
