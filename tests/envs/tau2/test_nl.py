"""mock's two tasks without expected actions, and τ²'s NL-assertion judge, on real components.

τ² 26.3's mock has two tasks with no expected actions: ``create_task_1_nl_eval`` (natural-
language assertions only; its reward basis is τ²'s default, DB and COMMUNICATE) and
``update_task_with_history_and_env_assertions`` (an env assertion). τ²'s own verdict
(``evaluate_simulation``, ``EvaluationType.ALL``) scores both without an LLM: NL assertions
enter a τ² reward only under its work-in-progress ``ALL_WITH_NL_ASSERTIONS`` and only where
the basis names them, which no task does. So: imported with ``actionless=True``, their
eval reward is τ²'s (checked against its ``evaluate_simulation``), and τ²'s NL judge (its own
prompt and parsing) runs through the pack's endpoint (``nl_judge``: a scripted OpenAI-compatible
endpoint on a real uvicorn here) as the extra check ``benchmark_nl_assertion``; without an
endpoint the verdict says they were not judged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.envs.tau2.parity import Call, Trajectory, outcome, served, tau2_reward
from tests.envs.tau2.scripted_endpoint import ScriptedEndpoint
from tests.support.openai_server import dead_url, serve_in_thread
from tests.support.server import ServerProcess, running_server, server_config
from tools.envs.pack import Pack
from tools.envs.tau2 import packs as tau2

pytestmark = pytest.mark.timeout(900)
NL_EVAL = "create_task_1_nl_eval"
HISTORY = "update_task_with_history_and_env_assertions"
CREATE = Call("create_task", {"user_id": "user_1", "title": "Important Meeting"})
COMPLETE = Call("update_task_status", {"task_id": "task_2", "status": "completed"})
SAID = ["Your task 'Important Meeting' is created. You are doing a great job!"]


def verdict(results: list[tuple[str, bool]]) -> str:
    """An answer in τ²'s judge format."""
    return json.dumps(
        {
            "results": [
                {"expectedOutcome": a, "reasoning": "scripted", "metExpectation": met} for a, met in results
            ]
        }
    )


@pytest.fixture(scope="module")
def judge_llm() -> Iterator[ScriptedEndpoint]:
    scripted = ScriptedEndpoint()
    with serve_in_thread(scripted.app) as url:
        scripted.url = url  # type: ignore[attr-defined]
        yield scripted


@pytest.fixture(scope="module")
def server(judge_llm: ScriptedEndpoint) -> Iterator[ServerProcess]:
    nl_judge = {"base_url": judge_llm.url + "/v1", "model": "scripted-judge", "max_retries": 0}  # type: ignore[attr-defined]
    environments = [
        {
            "source": "tools.envs.tau2:pack",
            "arguments": {"domain": "mock", "actionless": True, "nl_judge": nl_judge},
        }
    ]
    with running_server(server_config(environments=environments)) as srv:
        yield srv


@pytest.fixture(scope="module")
def pack() -> Pack:
    return tau2.pack("mock", actionless=True)


def test_the_two_tasks_are_imported_on_request() -> None:
    assert set(tau2.skipped("mock")) == {NL_EVAL, HISTORY} and tau2.skipped("mock", actionless=True) == {}
    assert len(tau2.pack("mock").tasks) == 7 and len(tau2.pack("mock", actionless=True).tasks) == 9
    task = tau2.pack("mock", actionless=True).task(NL_EVAL)
    assert task.gold.calls == [] and task.metadata["tau2_actionless"] is True
    assert task.metadata["tau2_reward_basis"] == ["DB", "COMMUNICATE"]  # τ²'s default: no NL_ASSERTION


@pytest.mark.parametrize(
    ("task_id", "calls", "expected"),
    [(NL_EVAL, [CREATE], 1.0), (NL_EVAL, [], 1.0), (HISTORY, [COMPLETE], 1.0), (HISTORY, [], 0.0)],
)
def test_their_eval_reward_is_tau2s_own(
    server: ServerProcess,
    judge_llm: ScriptedEndpoint,
    pack: Pack,
    task_id: str,
    calls: list[Call],
    expected: float,
) -> None:
    """τ²'s verdict needs no LLM; the judge's answer only adds ``benchmark_nl_assertion``."""
    task = pack.task(task_id)
    assertions = task.metadata["nl_assertions"]
    judge_llm.script(verdict([(a, False) for a in assertions]))  # the judge says no: the reward stays τ²'s
    result = outcome(server.url, pack, "mock", task, Trajectory("scripted", calls, SAID))
    assert result.tau2 == expected == result.ours, result
    assert result.components["benchmark_nl_assertion"] == 0.0
    assert f"not met: {assertions[0]!r}" in result.reason
    assert tau2_reward("mock", task.metadata["tau2_id"], Trajectory("scripted", calls, SAID))[0] == expected


def test_the_nl_judge_is_tau2s_prompt_through_the_endpoint(
    server: ServerProcess, judge_llm: ScriptedEndpoint, pack: Pack
) -> None:
    task = pack.task(NL_EVAL)
    assertions = task.metadata["nl_assertions"]
    judge_llm.script(verdict([(a, True) for a in assertions]))
    played = served(server.url, pack, task, Trajectory("scripted", [CREATE], SAID))
    assert played.score == 1.0 and played.components["benchmark_nl_assertion"] == 1.0
    (request,) = judge_llm.requests
    system, user = request["messages"]
    # τ²'s own prompt (tau2/evaluator/evaluator_nl_assertions.py), its temperature, the endpoint's model
    assert system["role"] == "system" and "Grade each expected outcome individually." in system["content"]
    assert "expectedOutcomes:" in user["content"] and str(assertions) in user["content"]
    assert f"assistant: {SAID[0]}" in user["content"] and "Important Meeting" in user["content"]
    assert request["temperature"] == 0.0 and request["model"] == "scripted-judge"


@pytest.mark.parametrize(
    ("answer", "why"),
    [("Yes, the task was created.", "JSONDecodeError"), (500, "unavailable|refused")],
)
def test_a_judge_that_fails_scores_the_check_0_and_says_why(
    server: ServerProcess, judge_llm: ScriptedEndpoint, pack: Pack, answer: Any, why: str
) -> None:
    judge_llm.script(answer)
    played = served(server.url, pack, pack.task(NL_EVAL), Trajectory("scripted", [CREATE], SAID))
    assert played.score == 1.0 and played.components["benchmark_nl_assertion"] == 0.0
    reason = played.details["benchmark"]["reason"]
    assert "NL-assertion judge failed" in reason and re.search(why, reason), reason


def test_without_an_endpoint_the_verdict_says_they_were_not_judged(pack: Pack) -> None:
    for nl_judge, expected in [(None, "no LLM endpoint"), ({"base_url": dead_url() + "/v1"}, "judge failed")]:
        judged = tau2.pack("mock", actionless=True, nl_judge=nl_judge)
        task = judged.task(NL_EVAL)
        world = judged.replay(task)
        judged.call(world, CREATE.name, CREATE.arguments)
        messages = [*task.prompt, {"role": "assistant", "content": SAID[0]}]
        verdict_ = judged.judge(task, messages, world.calls, world)  # type: ignore[misc]
        assert verdict_.reward == 1.0 and expected in verdict_.reason, verdict_
        assert ("nl_assertion" in verdict_.checks) == (nl_judge is not None)
