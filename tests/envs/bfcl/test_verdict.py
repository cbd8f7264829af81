"""BFCL's verdict in process: results written as BFCL's executor writes them, calls grouped
into user turns from the messages, nothing a model wrote evaluated, and the leaderboard's
arithmetic. (The served parity with BFCL's checker is ``tests/envs/test_reward_parity_bfcl.py``.)"""

from __future__ import annotations

import decimal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mpmath
import pytest

from tests.support.require import require

require("bfcl_eval", reason="bfcl-eval is installed by `make setup` (pip install --no-deps)")

from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils  # noqa: E402

from tools.envs.bfcl import packs as bfcl  # noqa: E402
from tools.envs.bfcl.calls import bfcl_result, public_methods  # noqa: E402
from tools.envs.bfcl.data import CATEGORIES, Entry, entries  # noqa: E402
from tools.envs.bfcl.leaderboard import category_of, leaderboard  # noqa: E402
from tools.envs.bfcl.state import TABLE, load_instance  # noqa: E402
from tools.envs.bfcl.verdict import Made, calls_by_turn, judge  # noqa: E402
from tools.envs.pack import EnvTask, Pack  # noqa: E402
from tools.envs.world import CallRecord  # noqa: E402


@pytest.fixture(autouse=True)
def _process_precision_kept() -> Iterator[None]:
    with decimal.localcontext():
        precision = mpmath.mp.prec
        yield
        mpmath.mp.prec = precision


@pytest.fixture(scope="module")
def packs() -> dict[str, Pack]:
    return {category: bfcl.pack(category) for category in CATEGORIES}


def bfcl_results(entry: Entry, category: str, calls: list[str]) -> list[str]:
    """BFCL's executor's result strings for ``calls``, run in one step from a fresh scenario."""
    name = f"verdict_{uuid.uuid4().hex}"
    try:
        results, _ = multi_turn_utils.execute_multi_turn_func_call(
            calls,
            entry.initial_config,
            entry.involved_classes,
            name,
            entry.id,
            long_context="long_context" in category,
            is_evaL_run=True,
        )
    finally:
        for key in [k for k in vars(multi_turn_utils) if k.startswith(name)]:
            del vars(multi_turn_utils)[key]
    return results


def instances(task: EnvTask) -> dict[str, Any]:
    return {name: load_instance(record) for name, record in task.state_patch[TABLE].items()}


@pytest.mark.parametrize("category", CATEGORIES)
def test_results_read_as_bfcls_executor_writes_them(packs: dict[str, Pack], category: str) -> None:
    """Every gold call's result string, errors and mpmath numbers included, is BFCL's own."""
    pack = packs[category]
    compared = 0
    for entry in entries(category):
        task = pack.task(entry.id)
        methods = public_methods(instances(task))
        ours = [bfcl_result(methods, c.name, c.arguments) for c in task.gold.calls]
        theirs = bfcl_results(entry, category, [s for turn in entry.ground_truth for s in turn])
        assert ours == theirs, entry.id
        compared += len(ours)
    assert compared > 1000


def test_what_bfcl_refuses_or_cannot_name_fails_the_same_way(packs: dict[str, Pack]) -> None:
    task = packs["multi_turn_base"].task("multi_turn_base_0")
    entry = next(e for e in entries("multi_turn_base") if e.id == task.id)
    methods = public_methods(instances(task))
    cases = {
        "exit()": ("exit", {}),  # BFCL's guard, before anything runs
        "get_flight_cost(travel_from='SFO')": (
            "get_flight_cost",
            {"travel_from": "SFO"},
        ),  # class not involved
        "cd(directory='x')": ("cd", {"directory": "x"}),  # an argument the method does not take
        "cd()": ("cd", {}),
        "ls(a=True)": ("ls", {"a": True}),
    }
    theirs = bfcl_results(entry, "multi_turn_base", list(cases))
    assert [bfcl_result(methods, name, arguments) for name, arguments in cases.values()] == theirs
    assert theirs[0] == "Error during execution: Function call exit is not allowed."


def test_nothing_a_model_writes_is_evaluated(packs: dict[str, Pack], tmp_path: Path) -> None:
    """BFCL's executor ``eval``s call strings; the verdict only ever calls methods by keyword."""
    task = packs["multi_turn_base"].task("multi_turn_base_0")
    marker = tmp_path / "evaluated"
    code = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    calls = [
        CallRecord("cd", {"folder": code}),
        CallRecord("echo", {"content": code, "file_name": "x.txt"}),
        CallRecord(code, {}),
    ]
    messages = [{"role": "assistant", "content": "..."}] + [
        {"role": "tool", "name": c.name, "content": "..."} for c in calls
    ]
    verdict = judge(task, messages, calls)
    assert verdict.reward == 0.0 and not marker.exists()
    methods = public_methods(instances(task))
    assert bfcl_result(methods, code, {}) == f"Error during execution: name '{code}' is not defined"


def chat(*turns: list[str | tuple[str, bool]], prompt: bool = False) -> list[dict[str, Any]]:
    """Messages for turns of tool names (a ``(name, False)`` tool message is a refused call)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "s"}] if prompt else []
    for number, turn in enumerate(turns):
        if number or prompt:
            messages.append({"role": "user", "content": f"turn {number}"})
        messages.append({"role": "assistant", "content": "<tool_call>...</tool_call>"})
        for item in turn:
            name = item if isinstance(item, str) else item[0]
            messages.append({"role": "tool", "name": name, "content": "..."})
        messages.append({"role": "assistant", "content": "done"})
    return messages


def test_calls_are_grouped_into_the_user_turns_they_were_made_in() -> None:
    calls = [CallRecord("ls", {}), CallRecord("cd", {"folder": "a"}), CallRecord("ls", {})]
    for with_prompt in (False, True):
        turns = calls_by_turn(chat(["ls", "cd"], [], [("mv", False), "ls"], prompt=with_prompt), calls)
        assert turns == [
            [Made("ls", calls[0]), Made("cd", calls[1])],
            [],
            [Made("ls", calls[2]), Made("mv", None)],
        ]
    # two user messages in a row are one turn; a parse error is no call
    messages = chat(["ls"], ["cd"])
    messages.insert(
        messages.index({"role": "user", "content": "turn 1"}), {"role": "user", "content": "more"}
    )
    messages.append({"role": "tool", "content": "could not parse", "error": "parse"})
    assert calls_by_turn(messages, calls[:2]) == [[Made("ls", calls[0])], [Made("cd", calls[1])]]
    # a logged call with no tool message belongs to the turn of the call before it
    assert calls_by_turn(chat(["ls"], ["cd"]), calls) == [
        [Made("ls", calls[0])],
        [Made("cd", calls[1]), Made("ls", calls[2])],
    ]


def test_bfcls_turn_rules(packs: dict[str, Pack]) -> None:
    task = packs["multi_turn_base"].task("multi_turn_base_0")
    by_id = {c.id: c for c in task.gold.calls}
    turns = [[by_id[i] for i in ids] for ids in task.metadata["turn_calls"]]

    def verdict(
        played: list[list[Any]], refused: dict[int, str] | None = None, drop_last_turn: bool = False
    ) -> Any:
        calls = [CallRecord(c.name, dict(c.arguments)) for turn in played for c in turn]
        names = [
            [c.name for c in turn] + ([(refused[n], False)] if refused and n in refused else [])
            for n, turn in enumerate(played)
        ]
        messages = chat(*(names[:-1] if drop_last_turn else names))
        return judge(task, messages, calls)

    gold = verdict(turns)
    assert gold.passed and gold.reward == 1.0 and gold.checks == {"turns": 1.0, "state": 1.0, "response": 1.0}
    short = verdict(turns, drop_last_turn=True)  # the conversation never reached the last turn
    assert short.reason.startswith("multi_turn:force_terminated") and short.checks["turns"] == 0.0
    emptied = [turns[0], [], *turns[2:]]
    empty = verdict(emptied)
    assert empty.reason.startswith("multi_turn:empty_turn_model_response") and empty.checks["turns"] == 0.25
    # a turn holding only a refused call is not empty for BFCL: the state check fails it instead
    refused = verdict(emptied, refused={1: "mv"})
    assert refused.reason.startswith("multi_turn:instance_state_mismatch") and refused.checks["state"] == 0.0
    late = verdict([turns[0][:-1], [turns[0][-1], *turns[1]], *turns[2:]])  # one call a turn late
    assert not late.passed and late.checks["turns"] == 0.0


def test_leaderboard_is_bfcls_arithmetic() -> None:
    rows = [("bfcl_multi_turn_base", f"t{i}", 1.0 if i < 3 else 0.0) for i in range(4)]
    rows += [("multi_turn_miss_func", "t0", 1.0), ("multi_turn_miss_func", "t0", 0.0)]  # k = 2 samples
    board = leaderboard(rows)
    assert board.categories["multi_turn_base"].accuracy == 0.75
    assert board.categories["multi_turn_miss_func"].accuracy == 0.5
    assert board.categories["multi_turn_miss_func"].samples == 2
    assert board.overall == (0.75 + 0.5) / 4  # a category not scored counts 0, as in BFCL
    lines = board.table().splitlines()
    assert lines[0].split(" | ")[0] == "Multi Turn Overall Acc"
    assert [cell.strip() for cell in lines[1].split(" | ")] == ["31.25%", "75.00%", "50.00%", "N/A", "N/A"]
    assert "multi_turn_base: 4 of 200 entries scored" in lines[2]
    with pytest.raises(ValueError, match="not a BFCL multi-turn"):
        category_of("tau2_airline")
