"""BFCL's own verdict on a trajectory: its ``multi_turn_checker``, over the calls that ran.

``judge`` is the BFCL packs' ``Pack.judge``: the ``tool_use`` reward in eval mode reports
its reward (1.0 when BFCL counts the entry correct, else 0.0). It does what BFCL's
evaluation (``_evaluate_single_multi_turn_entry`` then ``multi_turn_checker``) does, on
fresh instances of the entry's classes, one set for the model's calls and one for the gold:

1. The trajectory must hold as many user turns as the entry (BFCL: ``force_terminated``).
2. Turn by turn, the model's calls of the turn run, then the gold calls of the turn. A turn
   whose gold is empty (miss_param and miss_func turns, where the model should ask or say it
   cannot) is not checked, but its calls run and count later. For any other turn:
   - the model must have made a call in it (``empty_turn_model_response``);
   - every instance must equal the gold's, attribute by public attribute (``state``);
   - the gold calls' results must all be among the results of every call the model made so
     far, in any order, each used once (``response``: results compare as BFCL's executor
     writes them, see ``calls.bfcl_result``).
   The first failure is the verdict. BFCL's ``multi_turn_irrelevance_checker`` is not part of
   its evaluation, so calls in a turn with empty gold are not a failure in themselves.

BFCL ``eval``s call strings; here calls run by keyword on the instances (``calls``), from
the session's call log (``world.calls``: what ran, with its arguments as the server took
them), so nothing a model wrote is evaluated. A call the server refused before it ran (an
unknown tool, arguments against the schema, a function the driver still held back) is in
the messages as a named tool message with no entry in the log: it makes its turn non-empty,
as BFCL's decoder would, but it changes nothing and its result matches no gold result.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tools.envs.bfcl.calls import bfcl_result, public_methods
from tools.envs.bfcl.state import TABLE, load_instance
from tools.envs.pack import EnvTask, Verdict
from tools.envs.world import CallRecord, World

__all__ = ["Made", "calls_by_turn", "judge"]

CHECKS = ("turns", "state", "response")  # the Verdict's checks, 1.0 = not failed


@dataclass(frozen=True)
class Made:
    """A call the model made: ``record`` is None when the server refused it before it ran."""

    name: str
    record: CallRecord | None


def calls_by_turn(messages: Sequence[Mapping[str, Any]], calls: Sequence[CallRecord]) -> list[list[Made]]:
    """The calls of each user turn of the conversation, in the order they ran.

    A run of user messages after an assistant message starts the next turn (the prompt's
    own user message, when ``messages`` hold it, opens turn 0). Named tool messages line up
    with the call log by tool name (a longest matching alignment); one with no logged call
    was refused by the server, and a logged call with no message belongs to the turn of the
    call before it.
    """
    turn, spoke, previous = 0, False, None
    named: list[tuple[int, str]] = []  # (turn, tool) of each named tool message
    for message in messages:
        role = message.get("role")
        if role == "user" and spoke and previous != "user":
            turn += 1
        elif role == "assistant":
            spoke = True
        elif role == "tool" and message.get("error") != "parse" and message.get("name"):
            named.append((turn, str(message["name"])))
        previous = role
    out: list[list[Made]] = [[] for _ in range(turn + 1)]
    matcher = difflib.SequenceMatcher(None, [n for _, n in named], [c.name for c in calls], autojunk=False)
    turn_of_call: dict[int, int] = {}
    aligned: set[int] = set()
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            turn_of_call[block.b + k] = named[block.a + k][0]
            aligned.add(block.a + k)
    refused = [(t, name) for i, (t, name) in enumerate(named) if i not in aligned]
    last = 0
    for j, call in enumerate(calls):
        last = turn_of_call.get(j, last)
        out[last].append(Made(call.name, call))
    for t, name in refused:  # where they ran in the turn does not matter: they change nothing
        out[t].append(Made(name, None))
    return out


def judge(
    task: EnvTask,
    messages: Sequence[Mapping[str, Any]],
    calls: Sequence[CallRecord],
    world: World | None = None,
) -> Verdict:
    """BFCL's verdict on the trajectory (see the module's docstring); ``world`` is not read:
    the calls run again on fresh instances, so each turn's state can be checked."""
    turns: list[list[str]] = task.metadata["turn_calls"]
    made = calls_by_turn(messages, calls)
    if len(made) != len(turns):
        return _failed(
            "force_terminated",
            f"the conversation has {len(made)} user turns, the entry {len(turns)}: BFCL fails an entry "
            "whose conversation stopped before its last turn (or went past it); the driver must play "
            "every later turn (task metadata 'turns') before verifying",
            passed_turns=0,
            total=len(turns),
        )
    records = task.state_patch[TABLE]
    model = {name: load_instance(record) for name, record in records.items()}
    gold = {name: load_instance(record) for name, record in records.items()}
    model_methods, gold_methods = public_methods(model), public_methods(gold)
    golds = {call.id: call for call in task.gold.calls}
    results: list[str | None] = []  # every model call's result so far (None: refused, matches nothing)
    for number, (ids, turn) in enumerate(zip(turns, made, strict=True)):
        results.extend(
            None if m.record is None else bfcl_result(model_methods, m.name, m.record.arguments) for m in turn
        )
        expected = [bfcl_result(gold_methods, golds[i].name, golds[i].arguments) for i in ids]
        if not ids:
            continue
        if not turn:
            return _failed(
                "empty_turn_model_response",
                f"Model response list is empty for turn {number}",
                passed_turns=number,
                total=len(turns),
            )
        for name, instance in gold.items():
            differing = _differences(model[name], instance)
            if differing:
                return _failed(
                    "instance_state_mismatch",
                    f"Model instance for {name} does not match the state with ground truth instance "
                    f"after turn {number} (attributes: {', '.join(differing)}).",
                    passed_turns=number,
                    total=len(turns),
                    check="state",
                )
        missing = _missing(expected, results)
        if missing:
            return _failed(
                "execution_response_mismatch",
                f"Model response execution results so far does not contain all the ground truth "
                f"response execution results for turn {number} ({missing} of {len(expected)} missing).",
                passed_turns=number,
                total=len(turns),
                check="response",
            )
    return Verdict(1.0, True, dict.fromkeys(CHECKS, 1.0))


def _differences(model: Any, gold: Any) -> list[str]:
    """The public attributes of ``gold`` that ``model`` does not equal (BFCL's ``_compare_instances``)."""
    return [
        name
        for name in vars(gold)
        if not name.startswith("_") and getattr(model, name) != getattr(gold, name)
    ]


def _missing(expected: Sequence[str], results: Sequence[str | None]) -> int:
    """How many of ``expected`` are not among ``results`` (a multiset: each result used once)."""
    pool = list(results)
    missing = 0
    for item in expected:
        try:
            pool.remove(item)
        except ValueError:
            missing += 1
    return missing


def _failed(kind: str, message: str, *, passed_turns: int, total: int, check: str = "") -> Verdict:
    checks = dict.fromkeys(CHECKS, 1.0)
    checks["turns"] = passed_turns / total if total else 0.0
    if check:
        checks[check] = 0.0
    return Verdict(0.0, False, checks, f"multi_turn:{kind}: {message}")
