"""The ``tool_use`` reward on real packs, worlds and call logs (tools.verifiers.tool_use.reward).

A small shop pack is built from the real records (``tools/envs/pack.py``); trajectories
are produced by running calls through ``Pack.call`` on a fresh ``Pack.new_world``, as
the server does, so every world, call log and gold replay below is the real thing.
"""

from __future__ import annotations

import contextlib
import copy
import math
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import ToolError, VerifyRequest
from tests.envs.tool_use_shop import TOOLS
from tools.envs.pack import Complexity, EnvTask, Gold, GoldCall, Pack, PackInfo
from tools.envs.world import World
from tools.verifiers.tool_use.match import Candidate, match_calls
from tools.verifiers.tool_use.reward import COMPONENTS, DEFAULT_WEIGHTS, score
from tools.verifiers.tool_use.schema import compile_schema, schema_problem
from tools.verifiers.tool_use.values import argument_difference, same_value, standardize

COUNTS = {"extra_calls", "failed_calls"}

# --------------------------------------------------------------------------- a small shop world (tools in tool_use_shop)


STATE = {
    "products": {
        "p1": {"name": "Blue Mug", "price": 12.5, "stock": 3},
        "p2": {"name": "Red Kettle", "price": 40, "stock": 2},
    },
    "users": {"u1": {"name": "Ada", "favourite": "p2", "tags": []}},
    "orders": {},
}


def _task(task_id: str, calls: list[GoldCall], **kwargs: Any) -> EnvTask:
    task = EnvTask(
        task_id, [{"role": "user", "content": task_id}], Gold(calls, **kwargs.pop("gold", {})), **kwargs
    )
    task.complexity = Complexity.from_calls(task.gold.calls)
    return task


TASKS = [
    _task(  # single hop, a write
        "single",
        [GoldCall("place_order", {"user_id": "u1", "product_id": "p1", "quantity": 2})],
        gold={"answer": "o1", "communicate": ["25"]},
        tools=["get_product", "get_user", "place_order"],
    ),
    _task(  # parallel single hop: two reads in any order, then an answer
        "parallel",
        [
            GoldCall("get_product", {"product_id": "p1"}, id="a"),
            GoldCall("get_product", {"product_id": "p2"}, id="b"),
        ],
        gold={"answer": "52.5"},
        reward_basis=["calls", "answer"],
    ),
    _task(  # multi hop: the user's favourite product, then an order for it
        "multi",
        [
            GoldCall(
                "get_user", {"user_id": "u1"}, id="who", output={"user_id": "u1", **STATE["users"]["u1"]}
            ),
            GoldCall(
                "place_order",
                {"user_id": "u1", "product_id": "p2", "quantity": 1},
                id="buy",
                depends_on=["who"],
                compare=["user_id", "product_id", "quantity"],
            ),
        ],
        gold={"answer": "o1"},
    ),
    _task(
        "tags",
        [GoldCall("set_tags", {"user_id": "u1", "tags": ["vip", "eu"]})],
        reward_basis=["calls", "state"],
    ),
    _task(  # a lookup that fails in the gold replay too (τ² has these): the agent must try it
        "missing",
        [
            GoldCall("get_product", {"product_id": "p9"}, id="try"),
            GoldCall("get_product", {"product_id": "p1"}),
        ],
        reward_basis=["calls"],
    ),
]


def make_pack() -> Pack:
    return Pack(PackInfo("shop-test"), TOOLS, STATE, TASKS)


@pytest.fixture(scope="module")
def pack() -> Pack:
    return make_pack()


def run(pack: Pack, task: EnvTask, calls: list[tuple[str, dict[str, Any]]]) -> World:
    """A session: the calls run through ``Pack.call`` on a fresh world (failures are logged, as on the server)."""
    world = pack.new_world(task)
    for name, arguments in calls:
        with contextlib.suppress(ToolError):
            pack.call(world, name, arguments)
    return world


def gold_calls(task: EnvTask) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, dict(c.arguments)) for c in task.gold.calls]


def trajectory(
    world: World, answer: str | None, *, turns: list[int] | None = None, parse_errors: int = 0
) -> VerifyRequest:
    """The chat a rollout would record for ``world.calls``: one assistant turn per group, tool messages after it."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    groups = turns or [1] * len(world.calls)
    index = 0
    for size in groups:
        messages.append({"role": "assistant", "content": "<tool_call>...</tool_call>"})
        for call in world.calls[index : index + size]:
            messages.append({"role": "tool", "name": call.name, "content": str(call.output or call.error)})
        index += size
    for _ in range(parse_errors):
        messages.append({"role": "assistant", "content": "<tool_call>{bad json</tool_call>"})
        messages.append({"role": "tool", "content": "Error: not JSON", "error": "parse"})
    if answer is not None:
        messages.append({"role": "assistant", "content": f"Done. <answer>{answer}</answer>"})
    return VerifyRequest(
        verifier="tool_use", ground_truth={"pack": "shop-test"}, messages=messages, response_start=1
    )


def both(pack: Pack, task: EnvTask, world: World | None, request: VerifyRequest):
    return score(pack, task, world, request, mode="train"), score(pack, task, world, request, mode="eval")


# --------------------------------------------------------------------------- gold replay scores 1.0


@pytest.mark.parametrize("task_id", ["single", "parallel", "multi", "tags", "missing"])
def test_gold_replay_scores_one_in_both_modes(pack: Pack, task_id: str) -> None:
    task = pack.task(task_id)
    world = run(pack, task, gold_calls(task))
    turns = [2] if task_id == "parallel" else None  # the parallel pair in one turn
    answer = {"single": "o1", "parallel": "52.5", "multi": "o1"}.get(task_id)  # "tags" needs none
    request = trajectory(world, answer, turns=turns)
    if task_id == "single":  # communicate the total in an earlier turn
        request.messages.insert(-1, {"role": "assistant", "content": "The total is 25."})
    train, evaluation = both(pack, task, world, request)
    assert train.score == 1.0, train.details
    assert evaluation.score == 1.0, evaluation.details
    assert set(train.components) == set(COMPONENTS)
    for name in COMPONENTS:
        expected = 0.0 if name in COUNTS or name == "penalty" else 1.0
        assert train.components[name] == expected, (name, train.details)
    assert len(train.details["matches"]) == len(task.gold.calls)


def test_a_gold_call_that_fails_in_the_replay_is_matched_by_a_failing_call(pack: Pack) -> None:
    task = pack.task("missing")
    world = run(pack, task, gold_calls(task))
    assert world.calls[0].error is not None  # p9 does not exist, in the replay as here
    c = score(pack, task, world, trajectory(world, None)).components
    assert c["completeness"] == 1.0 and c["failed_calls"] == 0.0 and c["penalty"] == 0.0
    skipped = run(pack, task, gold_calls(task)[1:])
    result = score(pack, task, skipped, trajectory(skipped, None))
    assert result.components["completeness"] == 0.5
    assert "'product_id' is 'p1', gold 'p9'" in result.details["unmatched"][0]["why"]


def test_state_compares_by_value_across_copies_of_the_base(pack: Pack) -> None:
    """A session world from a reloaded pack (another copy of the same initial state) is still compared."""
    reloaded = Pack(PackInfo("shop-test"), TOOLS, copy.deepcopy(STATE), TASKS)
    task = pack.task("single")
    world = run(reloaded, task, gold_calls(task))
    assert world.base is not pack.new_world(task).base
    result = score(pack, task, world, trajectory(world, "o1"))
    assert result.components["state"] == 1.0 and result.components["state_fraction"] == 1.0
    wrong = run(reloaded, task, [("place_order", {"user_id": "u1", "product_id": "p1", "quantity": 1})])
    assert score(pack, task, wrong, trajectory(wrong, "o1")).components["state"] == 0.0


def test_gold_world_cache_is_per_pack_object() -> None:
    """The cached gold world is per pack object: a second pack with the same id is not confused with the first."""
    first, second = make_pack(), make_pack()
    for pack in (first, second):
        task = pack.task("single")
        world = run(pack, task, gold_calls(task))
        assert score(pack, task, world, trajectory(world, "o1")).components["state"] == 1.0


# --------------------------------------------------------------------------- what a wrong trajectory loses


def test_a_missing_gold_write_drops_calls_state_and_completeness(pack: Pack) -> None:
    task = pack.task("multi")
    world = run(pack, task, gold_calls(task)[:1])  # the read, not the order
    train, evaluation = both(pack, task, world, trajectory(world, "o1"))
    c = train.components
    assert c["completeness"] == 0.5 and c["calls"] == 0.0 and c["state"] == 0.0
    assert c["precision"] == 1.0 and c["f1"] == pytest.approx(2 * 1 / (1 + 2))
    assert c["state_fraction"] < 1.0 and c["answer"] == 1.0
    assert train.score < 1.0 and evaluation.score == 0.0
    assert train.details["unmatched"] == [{"gold": "buy", "why": "no call to place_order"}]
    assert train.details["state"]["differences"]  # the product stock and the order differ


def test_a_changed_compared_argument_does_not_match(pack: Pack) -> None:
    task = pack.task("single")
    world = run(pack, task, [("place_order", {"user_id": "u1", "product_id": "p1", "quantity": 3})])
    train, evaluation = both(pack, task, world, trajectory(world, "o1"))
    c = train.components
    assert c["matched"] == 0.0 and c["completeness"] == 0.0 and c["precision"] == 0.0
    assert c["extra_calls"] == 1.0 and c["penalty"] == pytest.approx(0.1)
    assert c["state"] == 0.0 and 0.0 <= c["state_fraction"] < 1.0
    assert c["schema"] == 1.0 and c["format"] == 1.0  # a valid call, just the wrong one
    assert train.score < 1.0 and evaluation.score == 0.0
    assert "quantity" in train.details["unmatched"][0]["why"]


def test_an_argument_outside_compare_is_ignored(pack: Pack) -> None:
    """``buy`` compares user, product and quantity: a note changes nothing."""
    task = pack.task("multi")
    calls = gold_calls(task)
    calls[1][1]["note"] = "gift wrap"
    world = run(pack, task, calls)
    assert score(pack, task, world, trajectory(world, "o1")).components["completeness"] == 1.0


def test_a_wrong_output_matches_but_does_not_solve(pack: Pack) -> None:
    """``who`` has an expected output; a world where the user changed first gives another one."""
    task = pack.task("multi")
    world = pack.new_world(task)
    world["users"]["u1"]["name"] = "Grace"  # the session's world is not the gold one
    for name, arguments in gold_calls(task):
        pack.call(world, name, arguments)
    result = score(pack, task, world, trajectory(world, "o1"))
    assert result.components["matched"] == 1.0
    assert result.components["completeness"] == 0.5  # ``who`` matched, not solved
    assert result.details["not_solved"][0]["gold"] == "who"


def test_parallel_calls_in_another_order_still_match(pack: Pack) -> None:
    task = pack.task("parallel")
    world = run(pack, task, list(reversed(gold_calls(task))))
    result = score(pack, task, world, trajectory(world, "52.5", turns=[2]), mode="eval")
    assert result.score == 1.0
    assert result.details["matches"] == {"a": 1, "b": 0}


def test_a_call_before_its_dependency_does_not_match(pack: Pack) -> None:
    task = pack.task("multi")
    world = run(pack, task, list(reversed(gold_calls(task))))  # order first, then look the user up
    result = score(pack, task, world, trajectory(world, "o1"))
    assert result.components["matched"] == 0.5 and result.components["calls"] == 0.0
    assert result.details["matches"] == {"who": 1}
    assert "depends on" in result.details["unmatched"][0]["why"]
    # the state is the gold one all the same: state and calls are separate components
    assert result.components["state"] == 1.0


def test_a_repeated_call_after_the_dependency_matches(pack: Pack) -> None:
    """Ordering too early, then looking up, then ordering again: the second order matches (exact search)."""
    task = pack.task("multi")
    order = gold_calls(task)[1]
    world = run(pack, task, [order, gold_calls(task)[0], ("place_order", dict(order[1]))])
    result = score(pack, task, world, trajectory(world, "o2"))
    assert result.components["matched"] == 1.0
    assert result.details["matches"] == {"who": 1, "buy": 2}
    assert result.components["extra_calls"] == 1.0  # the early order
    assert result.components["state"] == 0.0  # two orders were placed


def test_failed_calls_are_counted_and_never_solve(pack: Pack) -> None:
    task = pack.task("single")
    world = run(
        pack,
        task,
        [("place_order", {"user_id": "u1", "product_id": "p1", "quantity": 9})]  # not enough stock
        + gold_calls(task),
    )
    c = score(pack, task, world, trajectory(world, "o1")).components
    assert c["failed_calls"] == 1.0 and c["extra_calls"] == 1.0
    assert c["penalty"] == pytest.approx(0.2) and c["completeness"] == 1.0 and c["precision"] == 0.5


def test_parse_errors_lower_format(pack: Pack) -> None:
    task = pack.task("single")
    world = run(pack, task, gold_calls(task))
    clean = score(pack, task, world, trajectory(world, "o1"))
    messy = score(pack, task, world, trajectory(world, "o1", parse_errors=3))
    assert clean.components["format"] == 1.0
    assert messy.components["format"] == pytest.approx(1 / 4)
    assert messy.details["parse_errors"] == 3 and messy.score < clean.score


def test_a_bare_guess_earns_nothing_for_calls_it_never_tried(pack: Pack) -> None:
    """A trajectory that answers without the calls its task needs gets 0 for format and
    schema (nothing of its calls was right), so the default train reward pays a lucky
    guess less than the calls the task asks for; a task without gold calls still scores
    1.0 on them when no call is made."""
    task = pack.task("parallel")  # two reads, then the answer 52.5
    guess = score(pack, task, run(pack, task, []), trajectory(pack.new_world(task), "52.5"))
    assert (guess.components["format"], guess.components["schema"], guess.components["precision"]) == (
        0,
        0,
        0,
    )
    assert guess.components["answer"] == 1.0
    world = run(pack, task, gold_calls(task))
    wrong_answer = score(pack, task, world, trajectory(world, "50", turns=[2]))
    # under the default weights a lucky guess earns the answer and what it says only
    # (answer, communicate: 2 x 0.05, and no success: no call was made), far below the right
    # calls with a wrong answer
    assert guess.components["success"] == 0.0
    assert guess.score == pytest.approx(0.1) and guess.score < wrong_answer.score
    chat = _task("chat", [], gold={"answer": "hello"})
    chat_pack = Pack(PackInfo("chat-test"), TOOLS, STATE, [chat])
    polite = score(chat_pack, chat, run(chat_pack, chat, []), trajectory(chat_pack.new_world(chat), "hello"))
    assert (polite.components["format"], polite.components["schema"], polite.score) == (1.0, 1.0, 1.0)


def test_schema_invalid_calls_are_detected(pack: Pack) -> None:
    task = pack.task("single")  # exposes get_product, get_user, place_order
    world = run(
        pack,
        task,
        [
            ("place_order", {"user_id": "u1", "product_id": "p1", "quantity": "2"}),  # mistyped
            ("place_order", {"user_id": "u1", "product_id": "p1"}),  # missing required
            ("get_user", {"user_id": "u1", "verbose": True}),  # extra argument
            ("set_tags", {"user_id": "u1", "tags": []}),  # a real tool the task does not offer
            ("get_product", {"product_id": "p1"}),  # valid
        ],
    )
    request = trajectory(world, None)
    # the server refused a call to an unknown tool before it reached the world
    request.messages.insert(
        2, {"role": "tool", "name": "teleport", "content": "Error (unknown_tool): no tool"}
    )
    result = score(pack, task, world, request)
    problems = {p["call"]: p["problem"] for p in result.details["schema_problems"]}
    assert sorted(problems) == [0, 1, 2, 3]
    assert "'2' is not of type 'integer'" in problems[0]
    assert "'quantity' is a required property" in problems[1]
    assert "verbose" in problems[2] and "not offered" in problems[3]
    assert result.details["refused"] == [{"turn": 0, "name": "teleport"}]
    assert result.components["schema"] == pytest.approx(1 / 6)  # 1 valid of 5 run + 1 refused
    assert result.components["extra_calls"] == 6.0


def test_state_fraction_is_dense(pack: Pack) -> None:
    """Two records change in the gold world (p1's stock, the order); getting one of them right is half."""
    task = pack.task("single")
    gold = run(pack, task, gold_calls(task))
    assert len(gold.changed()) == 2
    world = pack.new_world(task)
    world["products"]["p1"]["stock"] = 1  # the stock as the gold order leaves it, but no order
    result = score(pack, task, world, trajectory(world, "o1"))
    assert result.components["state"] == 0.0
    assert result.components["state_fraction"] == pytest.approx(0.5)
    assert result.details["state"]["differences"] == [["orders", "o1"]]


def test_no_world_scores_state_zero_with_a_reason(pack: Pack) -> None:
    task = pack.task("single")
    result = score(pack, task, None, VerifyRequest(verifier="tool_use", response="<answer>o1</answer>"))
    assert result.components["state"] == 0.0 and result.components["state_fraction"] == 0.0
    assert "no world" in result.details["state"]["error"]
    assert result.components["answer"] == 1.0 and set(result.components) == set(COMPONENTS)


def test_truncated_trajectory_still_gets_every_component(pack: Pack) -> None:
    task = pack.task("multi")
    world = run(pack, task, gold_calls(task)[:1])
    request = trajectory(world, None)
    request.messages.append({"role": "assistant", "content": '<tool_call>{"name": "place_ord'})  # cut off
    train, evaluation = both(pack, task, world, request)
    assert set(train.components) == set(COMPONENTS) == set(evaluation.components)
    assert train.components["answer"] == 0.0 and train.components["completeness"] == 0.5
    assert 0.0 < train.score < 1.0 and evaluation.score == 0.0


def test_answers_compare_numbers_numerically(pack: Pack) -> None:
    task = pack.task("parallel")
    world = run(pack, task, gold_calls(task))
    for answer, expected in [
        ("52.50", 1.0),
        ("$52.5", 1.0),
        ("52.5000001", 1.0),
        ("52", 0.0),
        ("fifty", 0.0),
    ]:
        result = score(pack, task, world, trajectory(world, answer, turns=[2]))
        assert result.components["answer"] == expected, answer


def test_communicate_needs_whole_words(pack: Pack) -> None:
    task = pack.task("single")  # must communicate "25"
    world = run(pack, task, gold_calls(task))
    said = trajectory(world, "o1")
    said.messages.append({"role": "assistant", "content": "That is 25 in total."})
    not_said = trajectory(world, "o1")
    not_said.messages.append({"role": "assistant", "content": "That is 250 in total."})
    # inside a tool call (closed or cut off) is not telling the user
    not_said.messages.append({"role": "assistant", "content": '<tool_call>{"note": "25"}</tool_call>'})
    not_said.messages.append({"role": "assistant", "content": 'Hm. <tool_call>{"note": "25 <b>"'})
    assert score(pack, task, world, said).components["communicate"] == 1.0
    result = score(pack, task, world, not_said)
    assert result.components["communicate"] == 0.0 and result.details["communicate_missing"] == ["25"]


def test_what_is_said_inside_answer_tags_is_communicated(pack: Pack) -> None:
    """A reply wholly in tags (the one-format prompt: ``<answer>Done. 25</answer>``) tells the user
    25: the tags' punctuation once glued "answer" to the first and last words."""
    task = pack.task("single")  # must communicate "25"
    world = run(pack, task, gold_calls(task))
    for reply in (
        "<answer>25</answer>",
        "<answer>Done. 25</answer>",
        "<answer>o1</answer>, 25<answer>x</answer>",
    ):
        said = trajectory(world, "o1")
        said.messages.append({"role": "assistant", "content": reply})
        assert score(pack, task, world, said).components["communicate"] == 1.0, reply
    not_said = trajectory(world, "o1")
    not_said.messages.append({"role": "assistant", "content": "<answer>250</answer>"})
    assert score(pack, task, world, not_said).components["communicate"] == 0.0


def test_a_number_is_communicated_however_it_is_written(pack: Pack) -> None:
    """The value a tool returned, copied as the tool wrote it (7549.5 for a gold "7549.50"), is
    told; a longer number, an id that contains the digits, or another value is not."""
    task = pack.task("single")  # must communicate "25"
    world = run(pack, task, gold_calls(task))
    for reply, told in [
        ("The total is 25.0 euros.", True),
        ("Done. 25.00", True),
        ("<answer>Done. 25</answer>", True),
        ("That is 250 in total.", False),
        ("Order A-25 is placed.", False),
        ("It is 2.5 or 125.", False),
    ]:
        said = trajectory(world, "o1")
        said.messages.append({"role": "assistant", "content": reply})
        assert score(pack, task, world, said).components["communicate"] == float(told), reply


def test_per_step_f1_follows_the_paper(pack: Pack) -> None:
    """2·S_t/(N_t+1) per turn: one turn with both parallel reads earns 4/3 in the paper, capped at 1."""
    task = pack.task("parallel")
    world = run(pack, task, gold_calls(task) + [("get_user", {"user_id": "u1"})])
    result = score(pack, task, world, trajectory(world, "52.5", turns=[2, 1]))
    steps = result.details["steps"]
    assert steps == {"0": [2, 2], "1": [1, 0]}  # [calls, solved]: 2*2/3 and 0 in the paper
    assert result.components["f1_step"] == pytest.approx((1.0 + 0.0) / 2)
    assert result.components["f1"] == pytest.approx(2 * 2 / (3 + 2))


def test_weights_and_modes_are_checked(pack: Pack) -> None:
    task = pack.task("single")
    world = run(pack, task, gold_calls(task))
    request = trajectory(world, "o1")
    only_f1 = score(pack, task, world, request, weights={"f1": 1.0})
    assert only_f1.score == 1.0 and only_f1.details["weights"] == {"f1": 1.0}
    with pytest.raises(ValueError, match="unknown tool_use component 'speed'"):
        score(pack, task, world, request, weights={"speed": 1.0})
    with pytest.raises(ValueError, match="mode"):
        score(pack, task, world, request, mode="best")
    odd = EnvTask("odd", [], Gold([]), reward_basis=["vibes"])
    with pytest.raises(ValueError, match="reward_basis names 'vibes'"):
        score(pack, odd, world, request, mode="eval")
    assert sum(w for w in DEFAULT_WEIGHTS.values() if w > 0) == pytest.approx(1.0)


def test_tau2_basis_names_are_understood(pack: Pack) -> None:
    task = pack.task("tags")
    renamed = EnvTask("tags", task.prompt, task.gold, tools=task.tools, reward_basis=["DB", "ACTION"])
    world = run(pack, renamed, [("set_tags", {"user_id": "u1", "tags": ["eu", "vip"]})])
    result = score(pack, renamed, world, trajectory(world, None), mode="eval")
    assert result.details["basis"] == ["state", "calls"]
    assert result.score == 1.0  # the tags are a set (uniqueItems): another order matches, same state


# --------------------------------------------------------------------------- argument normalisation


@pytest.mark.parametrize(
    ("model", "gold", "schema", "same"),
    [
        ("April 1, 2024", "april 1,2024", None, True),
        ("New-York", "new york", None, True),
        ("it's", 'it"s', None, True),
        ("$5", "5", None, False),
        (2, 2.0, None, True),
        (0.1 + 0.2, 0.3, None, True),
        (1.0001, 1.0, None, False),
        (True, 1, None, False),
        ("5", 5, None, False),
        (None, "", None, False),
        (["a", "b"], ["b", "a"], None, False),
        (["a", "b"], ["B", "A"], {"type": "array", "uniqueItems": True}, True),
        (["a", "a"], ["a", "b"], {"type": "array", "uniqueItems": True}, False),
        ({"city": "Paris ", "n": 2}, {"city": "paris", "n": 2.0}, None, True),
        ({"city": "Paris"}, {"city": "Paris", "n": 1}, None, False),
    ],
)
def test_value_normalisation(model: Any, gold: Any, schema: Any, same: bool) -> None:
    assert same_value(model, gold, schema) is same


def test_argument_defaults_and_compare() -> None:
    properties = TOOLS[2].input_schema["properties"]
    gold = {"user_id": "u1", "product_id": "p1", "quantity": 2}
    assert (
        argument_difference({**gold, "note": ""}, gold, None, properties) is None
    )  # the default, spelled out
    assert "note" in argument_difference({**gold, "note": "hi"}, gold, None, properties)
    assert argument_difference({**gold, "note": "hi"}, gold, ["quantity"], properties) is None
    assert argument_difference({"quantity": 2}, gold, ["quantity"], properties) is None
    assert "missing" in argument_difference({"user_id": "u1"}, gold, None, properties)
    assert standardize("A_B-c.d/e*f^g h") == "abcdefgh"


# --------------------------------------------------------------------------- matching


def test_matching_is_optimal_where_greedy_is_not() -> None:
    """Call 0 fits gold 0 and gold 1; call 1 fits only gold 0. Greedy gives call 0 to gold 0 and loses gold 1."""
    candidates = [[Candidate(0, True), Candidate(1, True)], [Candidate(0, True)]]
    result = match_calls(candidates, [[], []])
    assert result.calls == [1, 0] and result.solved_count == 2 and result.exact


def test_matching_prefers_solving_over_matching_early() -> None:
    """The first call has a stale output; the repeat solves the sub-goal."""
    result = match_calls([[Candidate(0, False), Candidate(3, True)]], [[]])
    assert result.calls == [3] and result.solved == [True]


def test_matching_budget_keeps_the_best_found() -> None:
    n = 12
    candidates = [[Candidate(i, i % 2 == 0) for i in range(n)] for _ in range(n)]
    result = match_calls(candidates, [[] for _ in range(n)], budget=50)
    assert not result.exact and result.matched_count == n  # the greedy first leaf is already complete


@st.composite
def matching_problems(draw: st.DrawFn) -> tuple[list[list[Candidate]], list[list[int]]]:
    golds = draw(st.integers(0, 5))
    calls = draw(st.integers(0, 6))
    depends_on = [sorted(draw(st.sets(st.integers(0, g - 1), max_size=2))) if g else [] for g in range(golds)]
    candidates = [
        [
            Candidate(c, draw(st.booleans()))
            for c in sorted(draw(st.sets(st.integers(0, calls - 1), max_size=3)))
        ]
        if calls
        else []
        for _ in range(golds)
    ]
    return candidates, depends_on


def _best_by_brute_force(candidates: list[list[Candidate]], depends_on: list[list[int]]) -> tuple[int, int]:
    best = (0, 0)

    def walk(g: int, chosen: list[Candidate | None]) -> None:
        nonlocal best
        if g == len(candidates):
            solved = sum(1 for c in chosen if c is not None and c.solved)
            best = max(best, (solved, sum(1 for c in chosen if c is not None)))
            return
        walk(g + 1, [*chosen, None])
        for option in candidates[g]:
            taken = {c.call for c in chosen if c is not None}
            deps_ok = all(chosen[d] is not None and chosen[d].call < option.call for d in depends_on[g])
            if option.call not in taken and deps_ok:
                walk(g + 1, [*chosen, option])

    walk(0, [])
    return best


@settings(max_examples=400, deadline=None)
@given(problem=matching_problems())
def test_matching_equals_brute_force(problem: tuple[list[list[Candidate]], list[list[int]]]) -> None:
    """The search (with its dominance rules and one-pass case) finds the best (S, M) there is, and a valid matching."""
    candidates, depends_on = problem
    result = match_calls(candidates, depends_on)
    assert (result.solved_count, result.matched_count) == _best_by_brute_force(candidates, depends_on)
    taken = [c for c in result.calls if c >= 0]
    assert len(taken) == len(set(taken))
    for g, call in enumerate(result.calls):
        if call >= 0:
            option = next(o for o in candidates[g] if o.call == call)
            assert option.solved == result.solved[g]
            assert all(0 <= result.calls[d] < call for d in depends_on[g])


# --------------------------------------------------------------------------- property tests

TOOL_NAMES = [t.name for t in TOOLS] + ["teleport"]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.floats(allow_nan=False, width=32),
    st.sampled_from(["u1", "p1", "p2", "x"]),
)
ARGUMENTS = st.dictionaries(
    st.sampled_from(["user_id", "product_id", "quantity", "tags", "note", "zzz"]),
    st.one_of(SCALARS, st.lists(SCALARS, max_size=3)),
    max_size=4,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    task_index=st.integers(0, len(TASKS) - 1),
    calls=st.lists(st.tuples(st.sampled_from(TOOL_NAMES), ARGUMENTS), max_size=8),
    turns=st.lists(st.integers(1, 3), max_size=5),
    parse_errors=st.integers(0, 3),
    answer=st.one_of(st.none(), st.text(max_size=10)),
    weights=st.one_of(st.none(), st.dictionaries(st.sampled_from(COMPONENTS), st.floats(-3, 3), max_size=4)),
    keep_world=st.booleans(),
)
def test_every_component_stays_in_range(
    pack, task_index, calls, turns, parse_errors, answer, weights, keep_world
) -> None:
    task = TASKS[task_index]
    world = pack.new_world(task)
    for name, arguments in calls:
        try:
            pack.call(world, name, arguments)
        except Exception as exc:  # random arguments can break a tool any way; log it as failed
            world.calls[-1].error = world.calls[-1].error or repr(exc)
    request = trajectory(world, answer, turns=turns or None, parse_errors=parse_errors)
    for mode in ("train", "eval"):
        result = score(pack, task, world if keep_world else None, request, mode=mode, weights=weights)
        assert set(result.components) == set(COMPONENTS)
        assert 0.0 <= result.score <= 1.0 and not math.isnan(result.score)
        for name, value in result.components.items():
            if name in COUNTS:
                assert value >= 0 and float(value).is_integer()
            else:
                assert 0.0 <= value <= 1.0, (name, value)


JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.0, 1.0, 1.5, -2.0]),
    st.sampled_from(["", "a", "bb"]),
)
JSON = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("abc"), inner, max_size=3),
    max_leaves=6,
)
TYPES = st.sampled_from(["string", "integer", "number", "boolean", "null", "array", "object"])


def _schemas() -> st.SearchStrategy[dict[str, Any]]:
    leaf = st.fixed_dictionaries(
        {},
        optional={
            "type": TYPES | st.lists(TYPES, min_size=1, max_size=2, unique=True),
            "enum": st.lists(JSON_LEAVES, min_size=1, max_size=3),
            "const": JSON_LEAVES,
            "minimum": st.integers(-2, 2),
            "exclusiveMaximum": st.sampled_from([0, 1.5]),
            "minLength": st.integers(0, 2),
            "maxItems": st.integers(0, 2),
            "uniqueItems": st.booleans(),
            "description": st.just("annotation"),
        },
    )
    return st.recursive(
        leaf,
        lambda inner: (
            st.fixed_dictionaries(
                {"type": st.just("object")},
                optional={
                    "properties": st.dictionaries(st.sampled_from("abc"), inner, max_size=3),
                    "required": st.lists(st.sampled_from("abc"), max_size=2, unique=True),
                    "additionalProperties": st.booleans() | inner,
                },
            )
            | st.fixed_dictionaries(
                {"type": st.just("array")}, optional={"items": inner, "minItems": st.integers(0, 2)}
            )
        ),
        max_leaves=4,
    )


@settings(max_examples=400, deadline=None)
@given(schema=_schemas(), instance=JSON)
def test_compiled_schemas_agree_with_jsonschema(schema: dict[str, Any], instance: Any) -> None:
    expected = jsonschema.Draft202012Validator(schema).is_valid(instance)
    assert compile_schema(schema)(instance) is expected


def test_a_broken_schema_fails_calls_instead_of_crashing() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "colour"}}}
    assert compile_schema(schema)({"x": 1}) is False
    assert "unknown type 'colour'" in schema_problem(schema, {"x": 1})


def test_schemas_outside_the_subset_use_jsonschema() -> None:
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}}}
    check = compile_schema(schema)
    assert check({"code": "ABC"}) and not check({"code": "abc"})
