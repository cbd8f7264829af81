"""The project's model-backed parts against a real vLLM server instead of scripted endpoints:
the ``llm`` tool, the ``judge`` verifier, the τ² simulated user (all through a real tool
server), and ``env build`` end to end on a scenario.

The model is SmolLM2-135M: these tests check that each part works with a real engine
(requests, JSON mode, parsing, errors), not that a 135M model is good at the job. What it
managed is printed (``pytest -s``) and recorded in docs/environments.md for ``env build``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol import VerifyRequest
from tests.support.server import REPO, ServerProcess, running_server, server_config
from tools.data.environments import task_row
from tools.envs.tau2 import packs as tau2
from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
from trainer_client.backends.vllm_server import LocalVLLMServer
from trainer_client.client.tool_client import ToolClient
from trainer_client.rollout.core import RolloutConfig, RolloutCore, StopReason
from trainer_client.rollout.dataset import TaskRow

pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def tool_server(vllm_server: LocalVLLMServer) -> Iterator[ServerProcess]:
    """A tool server whose ``llm`` tool is the vLLM server (greedy), with the judge verifier and
    the τ² mock environment."""
    llm = {"base_url": vllm_server.url + "/v1", "model": "smollm2", "max_tokens": 96, "timeout_s": 300}
    config = server_config(
        tools=[{"target": "tools.llm:LlmTool", "args": llm}],
        verifiers=[{"target": "tools.verifiers.judge:judge"}],
        environments=[{"source": "tools.envs.tau2:pack", "arguments": {"domain": "mock"}}],
    )
    with running_server(config) as server:
        yield server


def test_the_llm_tool_answers_from_vllm(tool_server: ServerProcess) -> None:
    async def ask() -> Any:
        async with ToolClient(tool_server.url) as client:
            return await client.call("llm", {"prompt": "What is the capital of France?"})

    result = asyncio.run(ask())
    assert not result.is_error, result.error
    print(f"\nllm tool on vLLM: {result.text!r}")
    assert "Paris" in result.text  # greedy SmolLM2 knows this one


def test_the_judge_verifier_grades_through_vllm(tool_server: ServerProcess) -> None:
    question = [{"role": "user", "content": "What is the capital of France?"}]
    requests = [
        VerifyRequest(
            "judge", ground_truth="Paris", response=answer, messages=question, arguments={"max_tokens": 48}
        )
        for answer in ("<answer>Paris</answer>", "<answer>London</answer>")
    ]

    async def grade() -> list[Any]:
        async with ToolClient(tool_server.url) as client:
            return await client.verify(requests)

    results = asyncio.run(grade())
    for result in results:
        print(f"\njudge on vLLM: score {result.score}, details {json.dumps(result.details)[:300]}")
        assert 0.0 <= result.score <= 1.0
        # the grader's reply came back from the model: either a verdict was read from it, or
        # the reply is kept and the error says no score was found, never a failed call
        assert "judge_output" in result.details, result.details
        error = result.details.get("judge_error")
        assert error is None or "no score found" in error or "score" in error, error


def test_a_tau2_customer_played_by_vllm(tool_server: ServerProcess, smol_tokenizer: Any) -> None:
    """τ²'s mock task with the customer simulated by the real model through the ``llm`` tool;
    the agent is scripted, so each of the customer's turns is asked for."""
    pack = tau2.pack("mock")
    task = TaskRow.from_row(
        task_row(pack, pack.task("create_task_1"), split="test", index=0, user="simulated")
    ).task()
    tok = smol_tokenizer
    agent = [
        "Hello! How can I help you today?",
        "Could you tell me your user id and what the task should be called?",
        "Thank you, anything else?",
    ]
    turns = [ScriptedTurn(tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]) for t in agent]

    async def play() -> Any:
        async with ToolClient(tool_server.url) as client:
            config = RolloutConfig(
                max_turns=3, response_length=1500, max_obs_tokens=256, max_user_turns=2, verifier="tool_use",
                verifier_arguments={"mode": "eval"},
            )  # fmt: skip
            core = RolloutCore(tok, ScriptedGenerator(turns), client, config, verifier=client)
            return await core.run(task)

    tr = asyncio.run(play())
    said = [m["content"] for m in tr.messages[len(task.messages) :] if m["role"] == "user"]
    print(f"\nτ² customer on vLLM said: {said}; stop {tr.stop_reason}, reward {tr.reward_score}")
    assert tr.error is None, tr.error
    assert said and all(isinstance(s, str) and s.strip() for s in said)  # the model's own words
    assert tr.stop_reason in (StopReason.USER_STOP, StopReason.MAX_USER_TURNS, StopReason.MAX_TURNS)
    spliced = tok.decode([t for t, m in zip(tr.response_ids, tr.response_mask, strict=True) if m == 0])
    if tr.metrics["user_turns"]:  # a spliced customer message is an observation: mask 0
        assert said[0].strip()[:20] in spliced
    assert tr.reward_score is not None  # scored on the session's world


SCENARIO = "A small library: members borrow books and return them; staff list a member's loans."


def test_env_build_end_to_end_on_vllm(vllm_server: LocalVLLMServer, tmp_path: Path) -> None:
    """``tool-server env build`` with the real model behind it: every stage asks vLLM (JSON
    mode) and checks the answers; a 135M model is expected to be stopped by a check, and the
    report must say where and why. Recorded in docs/environments.md."""
    out = tmp_path / "build"
    command = [
        sys.executable, "-m", "tools.envs.builder",
        "--scenario", SCENARIO,
        "--model", vllm_server.url + "/v1",
        "--model-name", "smollm2",
        "--out", str(out),
        "--levels", "1",
        "--tasks-per-level", "2",
        "--attempts", "2",
        "--parallel", "4",
        "--max-tokens", "1024",
        "--no-progress",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500, check=False)
    print(f"\nenv build on vLLM (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-1500:]}")
    assert done.returncode in (0, 1), done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    first = next(iter(report["stages"].values()))
    assert first["candidates"] >= 1  # the model was asked and answered
    if report["status"] == "built":
        assert done.returncode == 0 and (out / "pack" / "pack.yaml").is_file()
    else:
        assert done.returncode == 1 and report["status"] == "failed"
        assert report["failed_stage"] and report["message"]  # where and why it stopped
        rejected = [r for log in report["stages"].values() for r in log["reasons"]]
        assert rejected or report["failed_stage"] == "gate", "a stage failed without a rejection reason"
        assert all(r["reason"] for r in rejected)
