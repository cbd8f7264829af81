"""A τ² task played with a simulated user, end to end on real components.

A real tool server hosts the τ² mock pack and the ``llm`` model tool, pointed at a
scripted OpenAI-compatible endpoint (a real uvicorn on loopback) that plays the customer.
The agent is a scripted generator over SmolLM2's tokenizer. The data row is built by the
data builder for a simulated user; the rollout core asks the user through the server
each time the agent ends a turn, and the ``tool_use`` verifier scores the session's world.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.support.openai_server import dead_url, serve_in_thread
from tests.support.server import ServerProcess, running_server, server_config
from tools.data import __main__ as data_cli
from tools.data.environments import build_rows, task_row
from tools.envs import procedural
from tools.envs.pack import Pack
from tools.envs.tau2 import packs as tau2
from trainer_client.backends.models import load_tokenizer
from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
from trainer_client.cli import command as rollout_cli
from trainer_client.client.tool_client import ToolClient
from trainer_client.rollout.core import RolloutConfig, RolloutCore, StopReason, Task, Trajectory
from trainer_client.rollout.dataset import TaskRow, load_tasks
from trainer_client.rollout.user_sim import STOP, simulator_messages

TASK = "create_task_1"  # the customer wants a task 'Important Meeting' created for user_1
GREETING = "Hello! How can I help you today?"
CREATE = '<tool_call>{"name": "create_task", "arguments": {"user_id": "user_1", "title": "Important Meeting"}}</tool_call>'
DONE = "Done: the task 'Important Meeting' now exists for user_1."
ASK = "I'd like a task called 'Important Meeting' created for user_1, please."


class ScriptedUser:
    """The customer's endpoint: hands out ``answers`` in order (an int is an HTTP error)
    and keeps every request body."""

    def __init__(self) -> None:
        self.answers: list[str | int] = []
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.app = Starlette(routes=[Route("/v1/chat/completions", self._complete, methods=["POST"])])

    def script(self, *answers: str | int) -> None:
        with self._lock:
            self.answers, self.requests = list(answers), []

    async def _complete(self, request: Request) -> Response:
        body = await request.json()
        with self._lock:
            self.requests.append(body)
            answer = self.answers.pop(0) if self.answers else 400
        if isinstance(answer, int):
            return JSONResponse({"error": {"message": f"scripted failure {answer}"}}, status_code=answer)
        message = {"role": "assistant", "content": answer}
        return JSONResponse(
            {
                "id": "chatcmpl-" + uuid.uuid4().hex[:12],
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model"),
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            }
        )


@pytest.fixture(scope="module")
def user() -> Iterator[ScriptedUser]:
    scripted = ScriptedUser()
    with serve_in_thread(scripted.app) as url:
        scripted.url = url  # type: ignore[attr-defined]
        yield scripted


@pytest.fixture(scope="module")
def server(user: ScriptedUser) -> Iterator[ServerProcess]:
    llm = {"model": "scripted-customer", "max_retries": 0, "timeout_s": 10}
    config = server_config(
        tools=[
            {"target": "tools.llm:LlmTool", "args": {**llm, "base_url": user.url + "/v1"}},  # type: ignore[attr-defined]
            {
                "target": "tools.llm:LlmTool",
                "name": "dead_llm",
                "args": {**llm, "base_url": dead_url() + "/v1"},
            },
        ],
        environments=[{"source": "tools.envs.tau2:pack", "arguments": {"domain": "mock"}}],
    )
    with running_server(config) as srv:
        yield srv


@pytest.fixture(scope="module")
def pack() -> Pack:
    return tau2.pack("mock")


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer("smollm2")


def rollout_task(pack: Pack, task_id: str = TASK, user: str = "simulated") -> Task:
    """The task as the trainer reads it: a data row, built and read back."""
    return TaskRow.from_row(task_row(pack, pack.task(task_id), split="test", index=0, user=user)).task()


def play(server: ServerProcess, tokenizer: Any, task: Task, agent: list[str], **config: Any) -> Trajectory:
    eos = tokenizer.eos_token_id
    turns = [ScriptedTurn(tokenizer(t, add_special_tokens=False)["input_ids"] + [eos]) for t in agent]

    async def run() -> Trajectory:
        async with ToolClient(server.url) as client:
            settings = {
                "max_turns": 8,
                "response_length": 4096,
                "max_obs_tokens": 1024,
                "verifier": "tool_use",
                "verifier_arguments": {"mode": "eval"},
                **config,
            }
            core = RolloutCore(
                tokenizer, ScriptedGenerator(turns), client, RolloutConfig(**settings), verifier=client
            )
            return await core.run(task)

    return asyncio.run(run())


def masked_text(tokenizer: Any, tr: Trajectory, mask: int) -> str:
    return tokenizer.decode([t for t, m in zip(tr.response_ids, tr.response_mask, strict=True) if m == mask])


# --------------------------------------------------------------------------- the conversation


def test_the_customer_is_heard_and_the_task_solved(server, user, pack, tokenizer) -> None:
    task = rollout_task(pack)
    user.script(ASK, f"Great, thank you! {STOP}")
    tr = play(server, tokenizer, task, [GREETING, CREATE, DONE])

    assert tr.error is None, tr.error
    assert tr.stop_reason == StopReason.USER_STOP and tr.metrics["user_stop"] == STOP
    assert tr.metrics["user_turns"] == 1 and tr.metrics["calls"] == 1 and tr.metrics["tool_errors"] == 0
    # the customer's message is an observation: in the response with mask 0, never mask 1
    assert ASK in masked_text(tokenizer, tr, 0) and ASK not in masked_text(tokenizer, tr, 1)
    assert DONE in masked_text(tokenizer, tr, 1)
    # the stop message ends the conversation: recorded, but no tokens (no model turn follows)
    assert tr.messages[-1] == {"role": "user", "content": f"Great, thank you! {STOP}"}
    assert "Great, thank you" not in tokenizer.decode(tr.response_ids)
    # the world the session played is scored: the task was created, as τ²'s gold wants
    assert tr.reward_score == 1.0, tr.reward_components
    assert tr.reward_components["state"] == 1.0


def test_the_customer_sees_the_chat_from_its_side(server, user, pack, tokenizer) -> None:
    task = rollout_task(pack)
    user.script(ASK, STOP)
    play(server, tokenizer, task, [GREETING, CREATE, DONE])

    assert len(user.requests) == 2
    first, second = (body["messages"] for body in user.requests)
    system = first[0]
    assert system["role"] == "system"
    assert pack.task(TASK).user_scenario in system["content"] and STOP in system["content"]
    assert pack.policy.strip()[:80] not in system["content"]  # the agent's policy is not the customer's
    # roles flipped: the customer's own messages are its assistant turns, the agent's its user turns
    assert first[1:] == [
        {"role": "assistant", "content": tau2.USER_OPENING},
        {"role": "user", "content": GREETING},
    ]
    # the agent's tool-call turn and the tool's result never reach the customer
    assert second[1:] == [
        {"role": "assistant", "content": tau2.USER_OPENING},
        {"role": "user", "content": GREETING},
        {"role": "assistant", "content": ASK},
        {"role": "user", "content": DONE},
    ]
    assert second == simulator_messages(
        task.user_scenario or "",
        task.messages
        + [
            {"role": "assistant", "content": GREETING},
            {"role": "user", "content": ASK},
            {"role": "assistant", "content": CREATE},
            {"role": "tool", "name": "create_task", "content": "{}"},
            {"role": "assistant", "content": DONE},
        ],
    )


def test_a_customer_who_stops_before_any_work_leaves_the_reward_below_one(
    server, user, pack, tokenizer
) -> None:
    """Same scoring path, other world: nothing was created, so the state check fails."""
    user.script(f"Never mind, I'll do it myself. {STOP}")
    tr = play(server, tokenizer, rollout_task(pack), [GREETING])
    assert tr.stop_reason == StopReason.USER_STOP and tr.metrics["calls"] == 0
    assert tr.reward_score is not None and tr.reward_score < 1.0
    assert tr.reward_components["state"] == 0.0


def test_max_user_turns_ends_a_customer_who_never_stops(server, user, pack, tokenizer) -> None:
    user.script("Hm?", "Sorry, what?", "Still there?")
    tr = play(server, tokenizer, rollout_task(pack), ["Hi!", "Hello?", "Anyone?", "Bye."], max_user_turns=2)
    assert tr.error is None, tr.error
    assert tr.stop_reason == StopReason.MAX_USER_TURNS
    assert len(user.requests) == 2 and tr.metrics["user_turns"] == 2
    assert user.answers == ["Still there?"]  # the third message was never asked for
    assert tr.metrics["assistant_turns"] == 3
    spliced = masked_text(tokenizer, tr, 0)
    assert "Hm?" in spliced and "Sorry, what?" in spliced


def test_the_turn_budget_still_bounds_the_conversation(server, user, pack, tokenizer) -> None:
    user.script("Hm?", "Sorry, what?", "Still there?")
    tr = play(server, tokenizer, rollout_task(pack), ["Hi!", "Hello?", "Anyone?"], max_turns=2)
    assert tr.stop_reason == StopReason.MAX_TURNS and len(user.requests) == 1


def test_a_dead_endpoint_ends_the_trajectory_with_a_clear_reason(server, user, pack, tokenizer) -> None:
    tr = play(server, tokenizer, rollout_task(pack), [GREETING, DONE], user_tool="dead_llm")
    assert tr.stop_reason == StopReason.USER_ERROR
    assert tr.error is not None and "dead_llm" in tr.error and "unavailable" in tr.error, tr.error
    assert tr.metrics["assistant_turns"] == 1 and tr.metrics["user_turns"] == 0
    assert tr.reward_score is not None and tr.reward_score < 1.0  # still scored, on the untouched world


def test_an_endpoint_error_mid_conversation_ends_it_too(server, user, pack, tokenizer) -> None:
    user.script(ASK, 500)
    tr = play(server, tokenizer, rollout_task(pack), [GREETING, CREATE, DONE])
    assert tr.stop_reason == StopReason.USER_ERROR and "500" in (tr.error or ""), tr.error
    assert tr.metrics["user_turns"] == 1 and tr.metrics["calls"] == 1
    assert tr.reward_score == 1.0  # the work was done before the customer's line dropped


def test_a_solo_row_never_asks_a_user(server, user, pack, tokenizer) -> None:
    task = rollout_task(pack, user="solo")
    assert task.user_scenario is None
    user.script(ASK)
    tr = play(server, tokenizer, task, [CREATE, DONE])
    assert tr.stop_reason == StopReason.EOS and user.requests == []
    assert tr.reward_score == 1.0


# --------------------------------------------------------------------------- the data


def test_simulated_rows_carry_the_scenario_and_the_opening_not_the_gold(pack) -> None:
    solo = build_rows(pack, test_fraction=0.0)["train"]
    simulated = build_rows(pack, test_fraction=0.0, user="simulated")["train"]
    assert len(solo) == len(simulated) == len(pack.tasks)
    for solo_row, row in zip(solo, simulated, strict=True):
        task = pack.task(row["extra_info"]["task"])
        assert "user_sim" not in solo_row["extra_info"]
        assert row["extra_info"]["user_sim"] == {"scenario": task.user_scenario}
        assert row["prompt"][-1] == {"role": "user", "content": tau2.USER_OPENING}
        assert row["prompt"][0] == solo_row["prompt"][0]  # the policy, as system text
        assert row["reward_model"]["ground_truth"] == {"pack": pack.id, "task": task.id}
        # nothing else changed: the same tools, level, verifier; no gold anywhere
        assert {k: v for k, v in row["extra_info"].items() if k != "user_sim"} == solo_row["extra_info"]
        gold = json.dumps([c.arguments for c in task.gold.calls if c.arguments])
        assert "depends_on" not in json.dumps(row) and (not task.gold.calls or gold not in json.dumps(row))


def test_the_builder_cli_writes_simulated_rows(tmp_path: Path, pack) -> None:
    argv = ["build", "--tasks", "env:tools.envs.tau2:pack", "--env-arg", "domain=mock"]
    assert data_cli.main([*argv, "--env-user", "simulated", "--out", str(tmp_path)]) == 0
    rows = [
        *load_tasks(tmp_path / "env" / "tau2-mock-simulated" / "train.parquet"),
        *load_tasks(tmp_path / "env" / "tau2-mock-simulated" / "test.parquet"),
    ]
    tasks = {row.extra_info["task"]: row.task() for row in rows}
    assert set(tasks) == {t.id for t in pack.tasks}
    assert all(t.user_scenario == pack.task(i).user_scenario for i, t in tasks.items())
    assert data_cli.main([*argv, "--out", str(tmp_path)]) == 0  # solo: the default, its own folder
    solo = load_tasks(tmp_path / "env" / "tau2-mock" / "train.parquet")
    assert all(row.task().user_scenario is None for row in solo)


def test_a_pack_without_scenarios_cannot_be_built_for_a_simulated_user() -> None:
    with pytest.raises(ValueError, match="no task with a user scenario"):
        build_rows(procedural.pack("shop", seed=0, tasks=10), user="simulated")
    with pytest.raises(ValueError, match="user must be one of"):
        task_row(tau2.pack("mock"), tau2.pack("mock").tasks[0], split="train", index=0, user="robot")


def test_the_rollout_cli_plays_the_simulated_user(server, user, tmp_path: Path) -> None:
    """``trainer-client rollout`` reads the row's scenario and honours --user-tool/--max-user-turns."""
    build = [
        "build",
        "--tasks",
        "env:tools.envs.tau2:pack",
        "--env-arg",
        "domain=mock",
        "--env-user",
        "simulated",
    ]
    assert data_cli.main([*build, "--out", str(tmp_path)]) == 0
    script = tmp_path / "agent.jsonl"
    script.write_text(json.dumps({"turns": [GREETING, "Could you say that again?", "Bye."]}) + "\n")
    out = tmp_path / "rollout.jsonl"
    data = str(tmp_path / "env" / "tau2-mock-simulated" / "train.parquet")
    rollout = ["rollout", "--server", server.url, "--data", data, "--limit", "1", "--script", str(script)]
    rollout += ["--verifier", "tool_use", "--out", str(out), "--no-progress", "--max-turns", "6"]

    def record() -> dict[str, Any]:
        (line,) = out.read_text().splitlines()
        return json.loads(line)

    user.script(ASK, "Hello?")
    assert rollout_cli.main([*rollout, "--max-user-turns", "1"]) == 0
    played = record()
    assert played["stop_reason"] == "max_user_turns" and played["error"] is None
    assert played["metrics"]["user_turns"] == 1 and len(user.requests) == 1
    assert {"role": "user", "content": ASK} in played["messages"]
    assert any(not s["model"] and ASK in s["text"] for s in played["segments"])
    assert played["reward"] is not None

    user.script(ASK)
    assert rollout_cli.main([*rollout, "--user-tool", "dead_llm"]) == 0
    failed = record()
    assert user.requests == [] and failed["stop_reason"] == "user_error" and "dead_llm" in failed["error"]
