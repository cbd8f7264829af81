"""τ²'s own verdict as the eval-mode reward (``tools.envs.tau2.verdict``), case by case.

Each case is scored by ``tool_use`` in eval mode over a world our tools ran the calls on, and
by τ²'s own ``evaluate_simulation`` on the trajectory as τ²'s orchestrator records it
(``tests.envs.tau2.parity.tau2_reward``). The finer ``tool_use`` components stay beside the
verdict and may say otherwise: that is the point of several cases here.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest

from protocol import ToolError, VerifyRequest
from tests.envs.tau2.parity import Call, Trajectory, tau2_reward
from tools.envs.pack import EnvTask, Pack
from tools.envs.tau2 import packs as tau2
from tools.envs.tau2.domain import load_domain
from tools.envs.tau2.verdict import MAX_ERRORS, MAX_STEPS, Run, evaluate, read_run
from tools.envs.world import CallRecord, World
from tools.verifiers.tool_use.reward import score


@pytest.fixture(scope="module")
def packs() -> dict[str, Pack]:
    return {domain: tau2.pack(domain) for domain in ("retail", "airline", "mock")}


def played(pack: Pack, task: EnvTask, calls: list[Call]) -> World:
    world = pack.new_world(task)
    for call in calls:
        with contextlib.suppress(ToolError):
            pack.call(world, call.name, call.arguments)
    return world


def eval_score(pack: Pack, task: EnvTask, calls: list[Call], texts: list[str]) -> Any:
    """The eval-mode tool_use result of a chat that made ``calls`` (one per turn), then said ``texts``."""
    world = played(pack, task, calls)
    messages: list[dict[str, Any]] = [*task.prompt]
    for record in world.calls:
        text = json.dumps({"name": record.name, "arguments": record.arguments})
        messages.append({"role": "assistant", "content": f"<tool_call>{text}</tool_call>"})
        messages.append(
            {"role": "tool", "name": record.name, "content": json.dumps(record.output or record.error)}
        )
    messages += [{"role": "assistant", "content": text} for text in texts]
    request = VerifyRequest(
        "tool_use", {"pack": pack.id, "task": task.id}, messages=messages, response_start=len(task.prompt)
    )
    return score(pack, task, world, request, mode="eval")


def gold(task: EnvTask) -> list[Call]:
    return [Call(c.name, dict(c.arguments)) for c in task.gold.calls]


def test_a_float_for_an_integer_fails_tau2s_db_hash_though_the_records_compare_equal(packs) -> None:
    pack, task = packs["airline"], packs["airline"].task("21")
    calls = gold(task)
    assert calls[-1].name == "update_reservation_baggages" and calls[-1].arguments["nonfree_baggages"] == 0
    calls[-1] = Call(calls[-1].name, {**calls[-1].arguments, "nonfree_baggages": 0.0})
    world = played(pack, task, calls)
    assert world.differences(pack.replay(task)) == []  # Python: 0.0 == 0, record for record
    source = load_domain("airline")
    assert source.db_hash(world) != source.db_hash(pack.replay(task))  # τ²'s hash: "0.0" is not "0"
    assert source.state_hash(world) != source.state_hash(pack.replay(task))
    result = eval_score(pack, task, calls, ["Done."])
    assert result.score == 0.0 and result.components["benchmark_db"] == 0.0
    assert result.components["state"] == 1.0  # the finer component stays as it was
    assert tau2_reward("airline", task.id, Trajectory("int_as_float", calls, ["Done."]))[0] == 0.0


def test_state_hash_is_equal_exactly_when_tau2s_hash_is(packs) -> None:
    pack, task = packs["airline"], packs["airline"].task("21")
    source = load_domain("airline")
    calls = gold(task)
    variants = [calls, calls[:1], calls[1:], [*calls, calls[-1]], calls[::-1], []]
    hashes = [(source.db_hash(w), source.state_hash(w)) for w in (played(pack, task, v) for v in variants)]
    for a_full, a_ours in hashes:
        for b_full, b_ours in hashes:
            assert (a_full == b_full) == (a_ours == b_ours)
    assert len({full for full, _ in hashes}) >= 3


def test_one_call_matches_two_gold_actions_and_a_failed_call_matches_too(packs) -> None:
    # retail 2 reads product 9523456873 twice in its gold: one read satisfies both actions
    pack, task = packs["retail"], packs["retail"].task("2")
    calls = gold(task)
    once = [c for i, c in enumerate(calls) if not (i == 9 and c.name == "get_product_details")]
    assert len(once) == len(calls) - 1
    said = ["Done. " + " ".join(task.gold.communicate)]
    result = eval_score(pack, task, once, said)
    assert result.components["benchmark_action"] == 1.0 and result.score == 1.0
    assert result.components["calls"] == 0.0  # ours matches one to one: a gold read is unmatched
    _, info = tau2_reward("retail", task.id, Trajectory("once", once, said))
    assert all(check.action_match for check in info.action_checks)
    # mock impossible_task_1 (DB and ACTION): any transfer_to_human_agents call, even one that fails
    pack, task = packs["mock"], packs["mock"].task("impossible_task_1")
    failing = [Call("transfer_to_human_agents", {"summary": "no", "urgency": "high"})]  # an unknown argument
    world = played(pack, task, failing)
    assert world.calls[0].error is not None
    result = eval_score(pack, task, failing, ["I cannot do that."])
    assert result.score == 1.0 and result.components["benchmark_action"] == 1.0
    assert result.components["calls"] == 0.0  # ours: a failed call solves nothing
    assert tau2_reward("mock", task.id, Trajectory("failed", failing, ["I cannot do that."]))[0] == 1.0


def test_communicate_is_tau2s_substring_test(packs) -> None:
    pack, task = packs["retail"], packs["retail"].task("19")  # tell 54.04 and 41.64
    calls = gold(task)
    cases = {
        "You get 54.04 and 41.64 back.": 1.0,
        "You get 1,54.04,0 and 41.64 back.": 1.0,  # commas dropped, then a substring of a longer number
        "YOU GET 54.04 AND 41.64.": 1.0,
        "You get 54.04.": 0.0,
        "You get fifty-four dollars and four cents, and 41.64.": 0.0,
    }
    for text, expected in cases.items():
        result = eval_score(pack, task, calls, [text])
        assert result.score == expected, text
        assert tau2_reward("retail", task.id, Trajectory("said", calls, [text]))[0] == expected, text
    split = eval_score(pack, task, calls, ["You get 54.04", "and 41.64 back."])  # one fact per message
    assert split.score == 1.0
    longer = eval_score(pack, task, calls, ["Refund: 154.041 and 41.64."])
    assert longer.score == 1.0 and longer.components["communicate"] == 0.5  # ours: whole words only


def test_the_reward_basis_and_its_edge_cases(packs) -> None:
    retail = load_domain("retail")
    no_criteria = retail.tasks["2"].model_copy(update={"evaluation_criteria": None})
    verdict = evaluate(retail, no_criteria, Run())
    assert verdict.reward == 1.0 and verdict.passed and "no evaluation criteria" in verdict.reason
    # "change nothing" (retail 24: its gold has no actions): τ² checks the DB and the facts
    pack, task = packs["retail"], packs["retail"].task("24")
    said = ["It is " + " and ".join(task.gold.communicate) + "."]
    result = eval_score(pack, task, [], said)
    assert result.score == 1.0 and result.components["benchmark_action"] == 1.0
    assert result.components["benchmark"] == tau2_reward("retail", "24", Trajectory("none", [], said))[0]
    # mock's env assertion on a task the run never created: τ²'s evaluator raises, a failed sample
    pack, task = packs["mock"], packs["mock"].task("create_task_1_with_env_assertions")
    result = eval_score(pack, task, [], ["Done."])
    assert result.score == 0.0 and "τ²'s evaluator fails" in result.details["benchmark"]["reason"]
    reward, error = tau2_reward("mock", task.id, Trajectory("none", [], ["Done."]))
    assert reward == 0.0 and isinstance(error, ValueError)


def _chat(*turns: tuple[str, list[str]], user: str | None = None, cut: bool = False) -> list[dict[str, Any]]:
    """Assistant turns (text, the tools it called: one tool message each)."""
    out: list[dict[str, Any]] = []
    for text, tools in turns:
        out.append({"role": "assistant", "content": text})
        out += [{"role": "tool", "name": name, "content": "..."} for name in tools]
    if user is not None:
        out.append({"role": "user", "content": user})
    return out if cut or out[-1]["role"] != "tool" else [*out, {"role": "assistant", "content": "Done."}]


def test_runs_tau2_would_not_have_scored() -> None:
    ok = CallRecord("get_order_details", {}, output={})
    bad = CallRecord("get_order_details", {}, error="Order not found")
    assert read_run(_chat(("", ["get_order_details"])), [ok]).ending == "agent_stop"
    assert read_run([], [ok, bad]).ending == "agent_stop"  # no chat: the log alone, finished
    cut = read_run(_chat(("", ["get_order_details"]), cut=True), [ok])
    assert cut.ending == "max_steps" and "last message is a tool result" in cut.why
    errors = [bad] * (MAX_ERRORS - 1)
    nine = read_run(_chat(*[("", ["get_order_details"])] * len(errors)), errors)
    assert nine.ending == "agent_stop"
    refused = _chat(*[("", ["get_order_details"])] * MAX_ERRORS)  # the 10th was refused by the server
    assert read_run(refused, errors).ending == "too_many_errors"
    long = _chat(*[("", ["get_order_details"])] * (MAX_STEPS // 2))
    assert read_run(long, [ok] * (MAX_STEPS // 2)).ending == "max_steps"
    assert read_run(_chat(("Bye", []), user="###STOP###"), []).ending == "user_stop"


def test_solo_runs_end_at_done() -> None:
    call = CallRecord("toggle_data", {}, output="ok")
    done = CallRecord("done", {}, output="###STOP###")
    after = CallRecord("toggle_roaming", {}, output="ok")
    run = read_run(
        _chat(("", ["toggle_data"]), ("", ["done"]), ("", ["toggle_roaming"])), [call, done, after], solo=True
    )
    assert run.ending == "agent_stop" and run.calls == [call]  # the call after done is not judged
    said = read_run(
        _chat(("Let me check.", []), ("", ["toggle_data"]), ("", ["done"])), [call, done], solo=True
    )
    assert said.ending == "agent_error" and "turn 0 made no tool call" in said.why
    never = read_run(_chat(("", ["toggle_data"])), [call], solo=True)
    assert never.ending == "agent_error"  # its last turn ("Done.") is text: τ² ends it there
    token = read_run(_chat(("", ["toggle_data"]), ("###STOP###", [])), [call], solo=True)
    assert token.ending == "agent_stop" and token.calls == [call]
