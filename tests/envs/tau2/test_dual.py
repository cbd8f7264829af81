"""τ²'s telecom in dual control, as τ² runs it: a simulated customer holds the phone's tools.

On real components: a real tool server serves the dual-control telecom pack (its "small"
split) and the ``llm`` model tool pointed at a scripted OpenAI-compatible endpoint (a real
uvicorn) that plays the customer, tool calls included. Checked here:

* the pack: the agent holds the agent's tools, the customer the phone's, τ²'s (non-solo)
  policy, τ²'s scenario; data rows give each side its own tools;
* the server tells the two apart by the call id (``protocol.messages.new_user_call_id``; any
  pack: ``test_user_tools.py``): the agent's calls to the phone's tools are refused, the
  customer's run on the session's world, and the customer reaches nothing else;
* parity: the gold and its perturbations, the customer's side included (actions dropped,
  repeated, moved, swapped, with other arguments, failing, done by the agent instead or by
  both, an agent's write done by the customer), scored by ``/v1/verify`` in eval mode and by
  τ²'s own ``evaluate_simulation``: no disagreement (``bench/environments/reward_parity_tau2.py`` runs
  ≥100 tasks);
* the rollout: the simulated customer's tool calls reach the world and the verdict, their
  results go back to the simulator, never to the agent.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from protocol import decode_results
from protocol.messages import new_user_call_id
from tests.envs.tau2.parity import Outcome, outcome, perturbations
from tests.envs.tau2.scripted_endpoint import ScriptedEndpoint, Tools
from tests.support.openai_server import serve_in_thread
from tests.support.server import ServerProcess, running_server, server_config
from tools.data.environments import build_rows, task_row
from tools.envs.pack import Pack
from tools.envs.tau2 import packs as tau2
from tools.envs.tau2.domain import load_domain
from tools.envs.tau2.verdict import DONE
from trainer_client.backends.models import load_tokenizer
from trainer_client.backends.scripted import ScriptedGenerator, ScriptedTurn
from trainer_client.client.tool_client import ToolClient
from trainer_client.rollout.core import RolloutConfig, RolloutCore, StopReason, Task, Trajectory
from trainer_client.rollout.dataset import TaskRow
from trainer_client.rollout.user_sim import STOP

pytestmark = pytest.mark.timeout(1800)
ROAMING = "[mobile_data_issue]user_abroad_roaming_enabled_off[PERSONA:None]"  # the customer turns roaming on
# The parity sample: a phone action and an agent write; two phone actions and two agent writes
# (a payment the phone makes); two phone actions with arguments; a task judged on actions too.
SAMPLE = [
    "[mobile_data_issue]user_abroad_roaming_disabled_off[PERSONA:Hard]",
    "[service_issue]overdue_bill_suspension[PERSONA:Easy]",
    "[mms_issue]break_app_both_permissions[PERSONA:Hard]",
    "[service_issue]lock_sim_card_pin[PERSONA:Hard]",
]


@pytest.fixture(scope="module")
def pack() -> Pack:
    return tau2.pack("telecom", split="small", mode="dual")


@pytest.fixture(scope="module")
def customer() -> Iterator[ScriptedEndpoint]:
    scripted = ScriptedEndpoint()
    with serve_in_thread(scripted.app) as url:
        scripted.url = url  # type: ignore[attr-defined]
        yield scripted


@pytest.fixture(scope="module")
def server(customer: ScriptedEndpoint) -> Iterator[ServerProcess]:
    llm = {"base_url": customer.url + "/v1", "model": "scripted-customer", "max_retries": 0}  # type: ignore[attr-defined]
    config = server_config(
        tools=[{"target": "tools.llm:LlmTool", "args": {**llm, "timeout_s": 30}}],
        environments=[
            {
                "source": "tools.envs.tau2:pack",
                "arguments": {"domain": "telecom", "split": "small", "mode": "dual"},
            },
        ],
    )
    with running_server(config, startup_timeout_s=600) as srv:
        yield srv


# --------------------------------------------------------------------------- the pack and its rows


def test_the_dual_pack_is_tau2s_dual_control(pack: Pack) -> None:
    source = load_domain("telecom")
    env = source.new_environment(solo_mode=False)  # τ²'s get_environment, as its CLI runs telecom
    agent = {t.name for t in env.get_tools()}
    phone = {t.name for t in env.get_user_tools()}
    assert pack.id == "tau2-telecom-dual-small" and len(pack.tasks) == 20
    assert {t.name for t in pack.tools} == agent | phone and DONE not in {t.name for t in pack.tools}
    assert pack.policy == env.get_policy() != source.solo_policy
    task = pack.task(ROAMING)
    tau2_task = source.tasks[ROAMING]
    assert task.user_scenario == str(tau2_task.user_scenario)
    assert set(task.metadata["user_tools"]) == phone and task.metadata["tau2_dual"] is True
    assert task.prompt == task.metadata["user_sim_prompt"] == [{"role": "user", "content": tau2.USER_OPENING}]
    assert [c.name for c in task.gold.calls] == ["toggle_roaming"]  # τ²'s gold action is the customer's
    with pytest.raises(ValueError, match="retail has no user tools"):
        tau2.pack("retail", mode="dual")
    with pytest.raises(ValueError, match="mode must be one of"):
        tau2.pack("telecom", mode="both")


def test_rows_give_the_agent_its_tools_and_the_customer_the_phones(pack: Pack) -> None:
    source = load_domain("telecom")
    phone = set(source.user_tools)
    rows = build_rows(pack, test_fraction=0.0, user="simulated", prefix="t_")["train"]
    assert len(rows) == len(pack.tasks)
    for row in rows:
        extra = row["extra_info"]
        agent_tools = {d["name"] for d in extra["tools"]}
        user_tools = {d["name"] for d in extra["user_sim"]["tools"]}
        assert agent_tools == {"t_" + n for n in set(source.schemas) - phone}
        assert user_tools == {"t_" + n for n in phone}
        assert extra["user_sim"]["scenario"] == pack.task(extra["task"]).user_scenario
        assert row["prompt"][-1] == {"role": "user", "content": tau2.USER_OPENING}
    task = TaskRow.from_row(rows[0]).task()  # as the trainer reads it: the phone's tools are not the agent's
    assert {t["function"]["name"] for t in task.tools or []} == {
        d["name"] for d in rows[0]["extra_info"]["tools"]
    }
    with pytest.raises(ValueError, match="--env-user simulated"):
        task_row(pack, pack.tasks[0], split="train", index=0)


# --------------------------------------------------------------------------- the server's rule


def _session(url: str, pack_id: str, task_id: str) -> str:
    session = f"dual-{uuid.uuid4().hex}"
    opened = httpx.post(
        url + "/v1/sessions",
        json={"session": session, "environment": {"pack": pack_id, "task": task_id}},
        timeout=60,
    )
    assert opened.status_code == 201, opened.text
    return session


def _calls(url: str, session: str, *calls: tuple[str, str, dict[str, Any]]) -> list[Any]:
    """(who, name, arguments) in order in one batch; who is 'agent' or 'user'."""
    body = [
        {
            "call_id": new_user_call_id() if who == "user" else uuid.uuid4().hex,
            "name": name,
            "arguments": arguments,
            "session": session,
        }
        for who, name, arguments in calls
    ]
    response = httpx.post(url + "/v1/calls", json={"calls": body}, timeout=120)
    assert response.status_code == 200, response.text
    return decode_results(response.content)


def test_the_phone_is_the_customers_on_the_telecom_pack(server: ServerProcess, pack: Pack) -> None:
    session = _session(server.url, pack.id, ROAMING)
    by_agent, by_user, status = _calls(
        server.url,
        session,
        ("agent", "toggle_roaming", {}),
        ("user", "toggle_roaming", {}),
        ("user", "check_network_status", {}),
    )
    assert by_agent.is_error and "is the user's" in by_agent.text
    assert not by_user.is_error and "Roaming" in by_user.text, by_user.text
    assert not status.is_error and "Roaming" in status.text
    (refused,) = _calls(
        server.url, session, ("user", "get_customer_by_phone", {"phone_number": "555-123-2002"})
    )
    assert refused.is_error and "may call only its own tools" in refused.text


# --------------------------------------------------------------------------- parity with τ²


@pytest.fixture(scope="module")
def outcomes(server: ServerProcess, pack: Pack) -> list[Outcome]:
    return [
        outcome(server.url, pack, "telecom", task, trajectory)
        for task in [pack.task(t) for t in SAMPLE]
        for trajectory in perturbations("telecom", task)
    ]


def test_every_dual_trajectory_gets_tau2s_own_reward(outcomes: list[Outcome]) -> None:
    disagree = [(o.task, o.kind, o.tau2, o.ours, o.reason) for o in outcomes if not o.agree]
    assert disagree == []
    assert all(o.tau2 == 1.0 for o in outcomes if o.kind == "gold")
    rewards = Counter(o.tau2 for o in outcomes if o.kind != "gold")
    assert rewards[1.0] >= 5 and rewards[0.0] >= 10, rewards  # not vacuous


def test_the_kinds_cover_the_customers_side(outcomes: list[Outcome]) -> None:
    def rewards(kind: str) -> set[float]:
        return {o.tau2 for o in outcomes if o.kind == kind}

    kinds = {o.kind for o in outcomes}
    assert kinds >= {
        "user_action_dropped",
        "user_action_repeated",
        "user_action_moved_first",
        "user_actions_swapped",
        "user_value_changed",
        "user_action_by_agent",
        "user_action_by_both",
        "agent_write_by_user",
        "user_failed_call",
        "user_too_many_errors",
        "agent_ending",
        "cut_off",
    }
    # the agent cannot do the customer's part (τ²'s agent has no phone tool): the env assertions fail
    assert rewards("user_action_by_agent") == {0.0} and rewards("user_action_by_both") == {1.0}
    assert rewards("user_action_dropped") == {0.0} and rewards("agent_write_by_user") == {0.0}
    assert rewards("user_too_many_errors") == {0.0} and rewards("user_failed_call") == {1.0}


# --------------------------------------------------------------------------- the rollout


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer("smollm2")


def play(server: ServerProcess, tokenizer: Any, task: Task, agent: list[str]) -> Trajectory:
    eos = tokenizer.eos_token_id
    turns = [ScriptedTurn(tokenizer(t, add_special_tokens=False)["input_ids"] + [eos]) for t in agent]

    async def run() -> Trajectory:
        async with ToolClient(server.url) as client:
            config = RolloutConfig(
                max_turns=8,
                response_length=8192,
                max_obs_tokens=1024,
                verifier="tool_use",
                verifier_arguments={"mode": "eval"},
            )
            return await RolloutCore(
                tokenizer, ScriptedGenerator(turns), client, config, verifier=client
            ).run(task)

    return asyncio.run(run())


ASK_ROAMING = "Please turn on data roaming on your phone and tell me what you see."
ROAMING_ON = "I turned roaming on, and mobile data works now."


def test_the_customer_acts_on_the_phone_and_the_verdict_sees_it(server, customer, pack, tokenizer) -> None:
    task = TaskRow.from_row(
        task_row(pack, pack.task(ROAMING), split="test", index=0, user="simulated")
    ).task()
    customer.script(
        "My mobile data does not work, I'm abroad.",
        Tools([("toggle_roaming", {})]),
        Tools([("check_status_bar", {})]),
        ROAMING_ON,
        f"Thanks! {STOP}",
    )
    tr = play(
        server, tokenizer, task, ["Hello! How can I help?", ASK_ROAMING, "Glad it works. Anything else?"]
    )

    assert tr.error is None, tr.error
    assert tr.stop_reason == StopReason.USER_STOP
    assert (
        tr.metrics["user_calls"] == 2
        and tr.metrics.get("user_tool_errors", 0) == 0
        and tr.metrics["calls"] == 0
    )
    # τ²'s verdict saw the customer's call act on the phone: the env assertions hold
    assert tr.reward_score == 1.0, (tr.reward_components, tr.reward_details.get("benchmark"))
    assert tr.reward_components["benchmark_env_assertion"] == 1.0
    # recorded as τ² records a user's tool calls: a user message with the call, a tool message for the user
    acted = [i for i, m in enumerate(tr.messages) if m.get("role") == "user" and m.get("tool_calls")]
    assert len(acted) == 2
    result = tr.messages[acted[0] + 1]
    assert result["role"] == "tool" and result["requestor"] == "user" and result["name"] == "toggle_roaming"
    assert result["tool_call_id"] == tr.messages[acted[0]]["tool_calls"][0]["id"]
    # the agent never sees them: not in its tokens; it sees only the customer's message
    agent_view = tokenizer.decode(tr.response_ids)
    assert result["content"] not in agent_view
    assert ROAMING_ON in agent_view
    # the simulator was asked with the phone's tools, and got its own results back (not the agent's)
    asks = customer.requests
    assert len(asks) == 5
    assert {t["function"]["name"] for t in asks[1]["tools"]} == {
        d["name"] for d in task.metadata["user_sim"]["tools"]
    }
    third = asks[2]["messages"]
    assert (
        third[-2]["role"] == "assistant"
        and third[-2]["tool_calls"][0]["function"]["name"] == "toggle_roaming"
    )
    assert third[-1] == {
        "role": "tool",
        "tool_call_id": third[-2]["tool_calls"][0]["id"],
        "content": result["content"],
    }
    assert "You have tools that act on your side" in third[0]["content"]


def test_a_customer_who_does_not_act_leaves_the_phone_broken(server, customer, pack, tokenizer) -> None:
    task = TaskRow.from_row(
        task_row(pack, pack.task(ROAMING), split="test", index=0, user="simulated")
    ).task()
    customer.script("My mobile data does not work.", ROAMING_ON, f"Thanks! {STOP}")  # claims, never calls
    tr = play(server, tokenizer, task, ["Hello!", ASK_ROAMING, "Great."])
    assert tr.stop_reason == StopReason.USER_STOP and tr.metrics.get("user_calls", 0) == 0
    assert tr.reward_score == 0.0 and tr.reward_components["benchmark_env_assertion"] == 0.0


def test_a_customers_bad_call_comes_back_to_it_and_a_stuck_one_ends_the_run(
    server, customer, pack, tokenizer
) -> None:
    task = TaskRow.from_row(
        task_row(pack, pack.task(ROAMING), split="test", index=0, user="simulated")
    ).task()
    customer.script(
        "Hi.",
        Tools([("enable_roaming", {"customer_id": "C1001", "line_id": "L1002"})]),  # the agent's tool
        *[Tools([("check_status_bar", {})])] * 17,
    )
    tr = play(server, tokenizer, task, ["Hello!", ASK_ROAMING])
    assert tr.stop_reason == StopReason.USER_ERROR and "tool calls 17 times in a row" in (tr.error or "")
    refused = next(m for m in tr.messages if m.get("role") == "tool" and m.get("name") == "enable_roaming")
    assert "may call only its own tools" in refused["content"]
    assert json.dumps(refused["content"]) in json.dumps(
        customer.requests[2]["messages"]
    )  # the customer learns why
