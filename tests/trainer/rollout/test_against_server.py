"""The rollout core against a real tool server through the batched ``ToolClient``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.server import running_server, server_config
from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
from trainer_client.client.tool_client import ToolClient
from trainer_client.rollout.core import RolloutConfig, RolloutCore, StopReason, Task, Trajectory
from trainer_client.rollout.dataset import TaskRow

EOS = 2  # <|im_end|> in SmolLM2


def _encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids


async def _roll_out(tokenizer: Any, url: str, scripts: dict[str, list[str]], fmt: str) -> list[Trajectory]:
    """One trajectory per script, concurrently, so their calls share POSTs."""
    turns = {q: [ScriptedTurn(_encode(tokenizer, t) + [EOS]) for t in texts] for q, texts in scripts.items()}

    def script(prompt_ids: list[int]) -> list[ScriptedTurn]:
        prompt = tokenizer.decode(prompt_ids)
        return next(t for q, t in turns.items() if q in prompt)

    generator = ScriptedGenerator(script, tokenizer=tokenizer, eos_token_ids=[EOS])
    async with ToolClient(url) as client:
        core = RolloutCore(tokenizer, generator, client, RolloutConfig(format=fmt, max_turns=2))
        tasks = [Task([{"role": "user", "content": q}]) for q in scripts]
        return await core.run_batch(tasks)


def _tool_texts(trajectory: Trajectory) -> list[str]:
    return [m["content"] for m in trajectory.messages if m["role"] == "tool"]


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with running_server(server_config(verifiers=[{"target": "tools.verifiers.match:exact_match"}])) as server:
        yield server.url


@pytest.mark.parametrize(
    ("fmt", "bad_call", "good_call", "reason"),
    [
        (
            "pythonic",
            "[calculator(expression={'1+1'})]",
            "[calculator(expression='2+3')]",
            "a set is not JSON; use a list",
        ),
        (
            "hermes",
            '<tool_call>{"name": "calculator", "arguments": {"expression": "\\ud83d"}}</tool_call>',
            '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>',
            "the string holds a lone surrogate (not valid UTF-8)",
        ),
    ],
)
def test_an_unserialisable_call_does_not_fail_its_neighbours_post(
    smol_tokenizer: Any, server_url: str, fmt: str, bad_call: str, good_call: str, reason: str
) -> None:
    scripts = {
        "question one": [bad_call, "<answer>2</answer>"],
        "question two": [good_call, "<answer>5</answer>"],
    }
    bad, good = asyncio.run(_roll_out(smol_tokenizer, server_url, scripts, fmt))
    assert [bad.stop_reason, good.stop_reason] == [StopReason.ANSWER, StopReason.ANSWER]
    assert _tool_texts(good) == ["5"]
    assert _tool_texts(bad) == [f"Error: calculator: argument expression cannot be sent as JSON: {reason}"]


def test_trajectory_records_each_call_and_the_verifiers_details(smol_tokenizer: Any, server_url: str) -> None:
    """What the workbench shows per call (server latency, cache, error kind) and the
    verifier's details travel from the real server into the trajectory."""
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>'
    # Expressions no other test of this module sends: a result-cache hit reports 0 ms.
    turns = [call % "17+25" + call % "1/0", "<answer>42</answer>"]
    generator = ScriptedGenerator(
        [ScriptedTurn(_encode(smol_tokenizer, t) + [EOS]) for t in turns], eos_token_ids=[EOS]
    )

    async def roll_out() -> Trajectory:
        async with ToolClient(server_url) as client:
            config = RolloutConfig(max_turns=2, verifier="exact_match")
            core = RolloutCore(smol_tokenizer, generator, client, config, verifier=client)
            return await core.run(Task([{"role": "user", "content": "17+25?"}], ground_truth="42"))

    tr = asyncio.run(roll_out())
    assert tr.stop_reason == StopReason.ANSWER and tr.reward_score == 1.0
    ok, failed = tr.calls
    assert (ok["turn"], ok["name"], ok["error"], failed["error"]) == (
        1,
        "calculator",
        None,
        "invalid_arguments",
    )
    assert ok["elapsed_ms"] > 0 and not ok["cached"]
    assert tr.messages[ok["message"]]["content"] == "42"
    assert tr.reward_details["answer"] == "42"


def test_a_stop_string_given_as_one_string_is_one_stop_string(smol_tokenizer: Any, server_url: str) -> None:
    """``sampling_params["stop"]`` may be a string (vLLM and SGLang take one): it is one stop
    string, not one per character (which ended the turn at the first "e", "r" or ">")."""
    text = "We compute 2+3 here. <answer>5</answer> and then ramble on"
    generator = ScriptedGenerator(
        [ScriptedTurn(_encode(smol_tokenizer, text) + [EOS])], tokenizer=smol_tokenizer, eos_token_ids=[EOS]
    )

    async def run() -> Trajectory:
        async with ToolClient(server_url) as client:
            config = RolloutConfig(sampling_params={"temperature": 1.0, "stop": "</answer>"})
            core = RolloutCore(smol_tokenizer, generator, client, config)
            return await core.run(Task([{"role": "user", "content": "What is 2+3?"}]))

    trajectory = asyncio.run(run())
    (call,) = generator.calls
    assert "</answer>" in call.sampling_params["stop"] and "e" not in call.sampling_params["stop"]
    assert trajectory.stop_reason == StopReason.ANSWER and trajectory.final_answer == "5"
    assert trajectory.messages[-1]["content"].startswith("We compute 2+3 here.")


def test_a_rows_verifier_arguments_reach_the_verifier(smol_tokenizer: Any, server_url: str) -> None:
    """``extra_info.verifier_arguments`` choose the verifier's options per row (as the veRL
    reward bridge reads them); the config's apply to rows without their own."""

    def row(extra_info: dict[str, Any]) -> Task:
        prompt = [{"role": "user", "content": "The capital of France?"}]
        data = {"prompt": prompt, "reward_model": {"ground_truth": "Paris"}, "extra_info": extra_info}
        return TaskRow.from_row(data).task()

    strict = row({"verifier": "exact_match", "verifier_arguments": {"require_answer_tag": True}})
    loose = row({"verifier": "exact_match"})
    generator = ScriptedGenerator(
        [ScriptedTurn(_encode(smol_tokenizer, "Paris") + [EOS])],
        tokenizer=smol_tokenizer,
        eos_token_ids=[EOS],
    )

    async def run() -> list[Trajectory]:
        async with ToolClient(server_url) as client:
            core = RolloutCore(smol_tokenizer, generator, client, RolloutConfig(), verifier=client)
            return await core.run_batch([strict, loose])

    untagged_strict, untagged_loose = asyncio.run(run())
    assert untagged_loose.reward_score == 1.0
    assert untagged_strict.reward_score == 0.0
    assert untagged_strict.reward_details["error"] == "no <answer> tag in the response"
