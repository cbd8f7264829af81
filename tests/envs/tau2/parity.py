"""Reward parity with τ²-bench: the gold made imperfect, scored by a real server and by τ² itself.

Used by ``tests/envs/test_reward_parity_tau2.py`` (a sample) and ``bench/environments/reward_parity_tau2.py``
(≥100 tasks per domain). ``perturbations`` turns a task's gold into non-gold trajectories of
many kinds (calls dropped, repeated, swapped, moved, failing, arguments changed in value,
case or type, facts told in other words, runs cut off); ``served`` plays one through a
server (a session bound to the task, ``/v1/calls``, then ``/v1/verify`` with ``tool_use`` in
eval mode); ``tau2_reward`` is τ²'s own verdict: the trajectory built the way τ²'s
orchestrator builds it (each call answered by τ²'s own environment, loaded from the package,
``get_response``), then τ²'s own ``evaluate_simulation`` (``EvaluationType.ALL``). Nothing of
``tools.envs.tau2.verdict`` runs on τ²'s side.
"""

from __future__ import annotations

import copy
import functools
import importlib
import json
import sys
import types
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from protocol import decode_results
from protocol.messages import new_user_call_id
from tests.envs.tau2 import reference
from tool_server.upstream.tools import schema_validator
from tools.envs.pack import EnvTask, Pack
from tools.envs.tau2.domain import load_domain

AGENT, USER = "assistant", "user"  # τ²'s requestors
UNKNOWN_ID = "#W0000000"
CLOSING = "Is there anything else I can help you with?"  # a last word that tells no fact
MAX_ERRORS = 10  # τ²'s orchestrator default (tau2.config.DEFAULT_MAX_ERRORS)


@dataclass
class Call:
    name: str
    arguments: dict[str, Any]
    requestor: str = AGENT  # dual control: USER for the simulated customer's own calls


DONE = Call("done", {})  # τ²'s solo agent's stop tool


@dataclass
class Trajectory:
    """What a model did: its calls in order, its texts to the customer, how the run ended.

    ``ending``: ``agent`` (the agent's last message is text), ``user`` (the customer then
    says ###STOP###), ``cut`` (the run stops after a tool result). Solo runs (telecom) hold
    their ``done`` call among the calls; their ``texts`` are text-only turns before the calls
    (which τ²'s solo mode does not allow).
    """

    kind: str
    calls: list[Call]
    texts: list[str] = field(default_factory=list)
    ending: str = "agent"
    note: str = ""
    sent: list[str] | None = None  # the texts as τ²'s agents send them (tool calls and thinking apart)


@dataclass
class Outcome:
    domain: str
    task: str
    kind: str
    tau2: float  # τ²'s reward
    ours: float  # /v1/verify's score in eval mode
    refused: int = 0  # calls the server refused (schema)
    # τ²'s reward had the refused calls never been made (τ² itself runs them: it checks no schema)
    tau2_without_refused: float | None = None
    reason: str = ""
    tau2_crashed: bool = False  # τ²'s evaluator raised (its run_tasks then scores 0.0)
    components: dict[str, float] = field(default_factory=dict)  # /v1/verify's components

    @property
    def agree(self) -> bool:
        return self.tau2 == self.ours


# --------------------------------------------------------------------------- perturbations


def perturbations(domain: str, task: EnvTask) -> Iterator[Trajectory]:
    """The gold, then the gold made imperfect in every way that applies to the task."""
    source = load_domain(domain)
    if task.metadata.get("tau2_dual"):
        yield from dual_perturbations(source, task)
        return
    solo = source.by_field
    gold = [Call(c.name, copy.deepcopy(c.arguments)) for c in task.gold.calls]
    said = [] if solo else [f"Done: {info}." for info in task.gold.communicate]
    writes = [i for i, c in enumerate(gold) if source.tool_types.get(c.name) == "write"]
    reads = [i for i, c in enumerate(gold) if source.tool_types.get(c.name) != "write"]

    def variant(kind: str, calls: list[Call], texts: list[str] | None = None, **kw: Any) -> Trajectory:
        if solo:  # the run ends at `done`; texts are turns before the calls
            return Trajectory(kind, [*calls, DONE], texts or [], **kw)
        return Trajectory(kind, calls, (said if texts is None else texts) or [CLOSING], **kw)

    if not task.metadata.get("tau2_actionless"):  # (τ² gives those no gold to play)
        yield variant("gold", gold)
    if writes:
        last = writes[-1]
        yield variant("dropped_write", gold[:last] + gold[last + 1 :])
        yield variant("repeated_write", [*gold, copy.deepcopy(gold[last])])
        yield variant("write_moved_first", [gold[last], *gold[:last], *gold[last + 1 :]])
    if reads:
        yield variant("dropped_read", gold[: reads[0]] + gold[reads[0] + 1 :])
        yield variant("extra_read", [*gold, copy.deepcopy(gold[reads[0]])])
    if len(gold) >= 2:
        i = len(gold) // 2 - (len(gold) % 2 == 0)
        yield variant("swapped", [*gold[:i], gold[i + 1], gold[i], *gold[i + 2 :]])
        yield variant("reversed", gold[::-1])
    for kind, change in (
        ("value_changed", _value_changed),
        ("case_changed", _case_changed),
        ("int_as_float", _int_as_float),
        ("float_as_int", _float_as_int),
    ):
        for index in [*writes[::-1], *reads]:
            changed = change(gold[index].arguments)
            if changed is not None:
                calls = copy.deepcopy(gold)
                calls[index] = Call(gold[index].name, changed)
                yield variant(kind, calls, note=f"{gold[index].name}: {json.dumps(changed)[:200]}")
                break
    failing = _failing_call(source)
    if failing is not None:
        yield variant("failed_call_added", [failing, *gold])
        yield variant("too_many_errors", [*[failing] * MAX_ERRORS, *gold])
    yield variant("no_calls", [])
    if solo:
        yield Trajectory("no_done", gold)
        yield variant("text_before_done", gold, ["Let me look into this for you."])
        if writes:
            last = writes[-1]
            yield Trajectory("write_after_done", [*gold[:last], *gold[last + 1 :], DONE, gold[last]])
        return
    if gold:
        yield variant("cut_off", gold, ending="cut")
    yield variant("user_stop", gold, ending="user")
    if said:
        info = task.gold.communicate
        yield variant("facts_missing", gold, said[1:])
        yield variant("facts_silent", gold, [CLOSING])
        yield variant("facts_upper_case", gold, [t.upper() for t in said])
        yield variant(
            "facts_split",
            gold,
            [f"About {x[: len(x) // 2]}" for x in info] + [x[len(x) // 2 :] for x in info],
        )
        yield variant("facts_inside_longer", gold, [f"Your code is 1{x}0." for x in info])
        yield variant("facts_with_commas", gold, [f"Done: {_with_commas(x)}." for x in info])
        yield variant("facts_other_words", gold, [f"Done: {_in_words(x)}." for x in info])
        # an LLM agent's content in τ² holds neither its tool calls nor its reasoning
        calls_only = [
            f'<tool_call>{{"name": "think", "arguments": {{"thought": "{x}"}}}}</tool_call>Done.'
            for x in info
        ]
        yield variant("facts_in_tool_call_only", gold, calls_only, sent=["Done."] * len(info))
        yield variant(
            "facts_in_thinking_only",
            gold,
            [f"<think>{x}</think>Done." for x in info],
            sent=["Done."] * len(info),
        )


def dual_perturbations(source: Any, task: EnvTask) -> Iterator[Trajectory]:
    """τ²'s dual control (telecom): the gold's phone actions are the simulated customer's calls,
    the rest the agent's; the customer ends the run with ###STOP###. Besides the kinds that
    apply to any run, the customer's side made imperfect: an action dropped, repeated, moved
    first, swapped, with other arguments, failing, ten failing; an action done by the agent
    instead (refused by the server; τ²'s agent has no such tool) or by both; an agent's write
    done by the customer instead (refused likewise)."""
    user_tools = set(task.metadata["user_tools"])
    gold = [
        Call(c.name, copy.deepcopy(c.arguments), USER if c.name in user_tools else AGENT)
        for c in task.gold.calls
    ]
    mine = [i for i, c in enumerate(gold) if c.requestor == USER]
    writes = [
        i for i, c in enumerate(gold) if c.requestor == AGENT and source.tool_types.get(c.name) == "write"
    ]

    def variant(kind: str, calls: list[Call], **kw: Any) -> Trajectory:
        return Trajectory(kind, calls, [CLOSING], **{"ending": "user", **kw})

    def without(index: int) -> list[Call]:
        return gold[:index] + gold[index + 1 :]

    def retold(index: int, requestor: str) -> list[Call]:
        return [*gold[:index], Call(gold[index].name, gold[index].arguments, requestor), *gold[index + 1 :]]

    yield variant("gold", gold)
    if mine:
        last = mine[-1]
        yield variant("user_action_dropped", without(last))
        yield variant("user_action_repeated", [*gold, copy.deepcopy(gold[last])])
        yield variant("user_action_moved_first", [gold[last], *without(last)])
        yield variant("user_action_by_agent", retold(last, AGENT))
        yield variant(
            "user_action_by_both", [*gold[:last], Call(gold[last].name, gold[last].arguments), *gold[last:]]
        )
        if len(mine) >= 2:
            a, b = mine[0], mine[1]
            swapped = list(gold)
            swapped[a], swapped[b] = gold[b], gold[a]
            yield variant("user_actions_swapped", swapped)
        for index in mine[::-1]:
            changed = _value_changed(gold[index].arguments)
            if changed is not None:
                calls = copy.deepcopy(gold)
                calls[index] = Call(gold[index].name, changed, USER)
                yield variant(
                    "user_value_changed", calls, note=f"{gold[index].name}: {json.dumps(changed)[:200]}"
                )
                break
    failing = Call("set_apn_settings", {"apn_settings": {"apn_name": 5}}, USER)  # τ²'s model refuses 5
    yield variant("user_failed_call", [failing, *gold])
    yield variant("user_too_many_errors", [*[failing] * MAX_ERRORS, *gold])
    if writes:
        last = writes[-1]
        yield variant("agent_write_by_user", retold(last, USER))
        yield variant("dropped_write", without(last))
        yield variant("repeated_write", [*gold, copy.deepcopy(gold[last])])
    if len(gold) >= 2:
        yield variant("reversed", gold[::-1])
    for kind, change in (("value_changed", _value_changed), ("int_as_float", _int_as_float)):
        for index in [*writes[::-1], *range(len(gold))]:
            changed = change(gold[index].arguments)
            if changed is not None:
                calls = copy.deepcopy(gold)
                calls[index] = Call(gold[index].name, changed, gold[index].requestor)
                yield variant(kind, calls, note=f"{gold[index].name}: {json.dumps(changed)[:200]}")
                break
    agent_failing = _failing_call(source)
    if agent_failing is not None:
        yield variant("failed_call_added", [agent_failing, *gold])
        yield variant("too_many_errors", [*[agent_failing] * MAX_ERRORS, *gold])
    yield variant("no_calls", [])
    yield variant("agent_ending", gold, ending="agent")  # the customer never says ###STOP###
    if gold:
        yield variant("cut_off", gold, ending="cut")


def _value_changed(arguments: dict[str, Any]) -> dict[str, Any] | None:
    """One argument changed: a number + 1, else a list reversed, else a string with 'x' added."""
    for key in sorted(arguments):
        value = arguments[key]
        if isinstance(value, int | float) and not isinstance(value, bool):
            return {**arguments, key: value + 1}
    for key in sorted(arguments):
        value = arguments[key]
        if isinstance(value, list) and value != value[::-1]:
            return {**arguments, key: value[::-1]}
    for key in sorted(arguments):
        if isinstance(arguments[key], str):
            return {**arguments, key: arguments[key] + "x"}
    return None


def _case_changed(arguments: dict[str, Any]) -> dict[str, Any] | None:
    for key in sorted(arguments):
        value = arguments[key]
        if isinstance(value, str) and value.swapcase() != value:
            return {**arguments, key: value.swapcase()}
    return None


def _int_as_float(arguments: Any) -> Any:
    """The first integer (nested too) sent as a float: 2 -> 2.0 (a JSON schema integer still)."""
    return _retyped(arguments, lambda v: isinstance(v, int) and not isinstance(v, bool), float)


def _float_as_int(arguments: Any) -> Any:
    return _retyped(arguments, lambda v: isinstance(v, float) and v.is_integer(), int)


def _retyped(value: Any, wanted: Any, cast: Any) -> Any:
    if wanted(value):
        return cast(value)
    if isinstance(value, dict):
        for key in sorted(value):
            changed = _retyped(value[key], wanted, cast)
            if changed is not None:
                return {**value, key: changed}
    if isinstance(value, list):
        for i, item in enumerate(value):
            changed = _retyped(item, wanted, cast)
            if changed is not None:
                return [*value[:i], changed, *value[i + 1 :]]
    return None


def _failing_call(source: Any) -> Call | None:
    """A lookup of an id that does not exist: the tool raises, the call fails."""
    for name, schema in source.schemas.items():
        required = schema.get("parameters", {}).get("required") or []
        props = schema.get("parameters", {}).get("properties") or {}
        if (
            source.tool_types.get(name) == "read"
            and len(required) == 1
            and props.get(required[0], {}).get("type") == "string"
            and required[0].endswith("_id")
        ):
            return Call(name, {required[0]: UNKNOWN_ID})
    return None


def _with_commas(text: str) -> str:
    """Digits grouped with commas (1093.34 -> 1,093.34; 55 -> 5,5): τ² drops commas before matching."""
    if text.replace(".", "", 1).isdigit():
        whole, _, rest = text.partition(".")
        grouped = f"{int(whole):,}" if len(whole) > 3 else ",".join(whole)
        return grouped + ("." + rest if rest else "")
    return text.replace(" ", ", ")


def _in_words(text: str) -> str:
    """The fact in other words: digits spelled, or the words joined by dashes."""
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    if any(ch.isdigit() for ch in text):
        return " ".join(names[int(ch)] if ch.isdigit() else ch for ch in text)
    return text.replace(" ", "-") + "s"


# --------------------------------------------------------------------------- our side: a real server


@dataclass
class Served:
    score: float
    components: dict[str, float]
    details: dict[str, Any]
    ran: list[Call]  # the calls that reached the world (the server refused the others)
    refused: int


def served(url: str, pack: Pack, task: EnvTask, trajectory: Trajectory, prefix: str = "") -> Served:
    """Play the trajectory in a session through ``/v1/calls``, score it with ``/v1/verify`` (eval).

    ``prefix``: what the server puts in front of the pack's tool names (its environments entry).
    """
    session = f"parity-{uuid.uuid4().hex}"
    environment = {"pack": pack.id, "task": task.id}
    opened = httpx.post(
        url + "/v1/sessions", json={"session": session, "environment": environment}, timeout=120
    )
    assert opened.status_code == 201, opened.text
    solo = bool(task.metadata.get("tau2_solo"))
    messages: list[dict[str, Any]] = [*task.prompt]
    if solo:
        messages += [{"role": "assistant", "content": text} for text in trajectory.texts]
    ran: list[Call] = []
    refused = 0
    if trajectory.calls:
        body = {
            "calls": [
                {
                    # the customer's calls are marked as such: the server runs the phone's tools
                    # only for them
                    "call_id": new_user_call_id() if c.requestor == USER else uuid.uuid4().hex,
                    "name": prefix + c.name,
                    "arguments": c.arguments,
                    "session": session,
                }
                for c in trajectory.calls
            ]
        }
        response = httpx.post(url + "/v1/calls", json=body, timeout=300)
        assert response.status_code == 200, response.text
        validators = {t.name: schema_validator(t.name, t.input_schema) for t in pack.tools}
        for index, (call, result) in enumerate(
            zip(trajectory.calls, decode_results(response.content), strict=True)
        ):
            if call.requestor == USER:  # as the rollout records the simulated user's calls
                function = {"name": prefix + call.name, "arguments": json.dumps(call.arguments)}
                tool_call = {"id": f"u{index}", "type": "function", "function": function}
                messages.append({"role": "user", "content": "", "tool_calls": [tool_call]})
                messages.append(
                    {
                        "role": "tool",
                        "name": prefix + call.name,
                        "content": result.text,
                        "requestor": USER,
                        "tool_call_id": tool_call["id"],
                    }
                )
            else:
                text = json.dumps({"name": prefix + call.name, "arguments": call.arguments})
                messages.append({"role": "assistant", "content": f"<tool_call>{text}</tool_call>"})
                messages.append({"role": "tool", "name": prefix + call.name, "content": result.text})
            if _valid(validators[call.name], call.arguments):
                ran.append(call)
            else:
                assert result.is_error and result.error.kind.value == "invalid_arguments", result
                refused += 1
    if solo:
        messages.append({"role": "assistant", "content": "Finished."})  # after `done`, or in its place
    elif trajectory.ending != "cut":
        messages += [{"role": "assistant", "content": text} for text in trajectory.texts]
        if trajectory.ending == "user":
            messages.append({"role": "user", "content": "###STOP###"})
    request = {
        "verifier": "tool_use",
        "ground_truth": environment,
        "messages": messages,
        "response_start": len(task.prompt),
        "session": session,
        "arguments": {"mode": "eval"},
    }
    verified = httpx.post(url + "/v1/verify", json={"requests": [request]}, timeout=300)
    assert verified.status_code == 200, verified.text
    result = verified.json()["results"][0]
    assert not result.get("is_error"), result
    httpx.delete(url + f"/v1/sessions/{session}", timeout=60)
    return Served(result["score"], result["components"], result["details"], ran, refused)


def _valid(validate: Any, arguments: dict[str, Any]) -> bool:
    try:
        validate(arguments)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------- τ²'s side: its own code


def tau2_reward(
    domain: str,
    task_id: str,
    trajectory: Trajectory,
    calls: list[Call] | None = None,
    *,
    solo: bool | None = None,
) -> tuple[float, Any]:
    """τ²'s reward for the trajectory (``calls`` overrides the calls it makes), and its RewardInfo.

    The messages are what τ²'s orchestrator would record: τ²'s environment from the package
    (its registry's constructor) set to the task's initial state, each call answered by
    its ``get_response`` (a customer's call as its user simulator sends it: a user message
    with the tool call, requestor user); the ending is the orchestrator's termination reason.
    ``solo``: τ²'s solo mode (default: for a domain with user tools, telecom's solo pack).
    """
    message = importlib.import_module("tau2.data_model.message")
    simulation = importlib.import_module("tau2.data_model.simulation")
    evaluate_simulation, registry = _tau2_evaluator()
    source = load_domain(domain)
    solo = source.by_field if solo is None else solo
    task = source.tasks[task_id]
    env = registry.get_env_constructor(domain)(solo_mode=solo)
    state = task.initial_state
    history = copy.deepcopy(state.message_history) if state and state.message_history else []
    if state is not None:
        env.set_state(state.initialization_data, state.initialization_actions, history)
    messages = list(history)
    reason = simulation.TerminationReason
    ending = reason.AGENT_STOP
    if solo and trajectory.texts:  # LLMSoloAgent: a text-only turn ends the run (orchestrator)
        ending = reason.AGENT_ERROR
    errors = 0
    for index, call in enumerate(trajectory.calls if calls is None else calls):
        if solo and call.name == DONE.name:  # LLMSoloAgent: the done call becomes a stop message
            messages.append(message.AssistantMessage(role="assistant", content="###STOP###"))
            break
        tool_call = message.ToolCall(
            id=f"t{index}", name=call.name, arguments=copy.deepcopy(call.arguments), requestor=call.requestor
        )
        if call.requestor == USER:
            messages.append(message.UserMessage(role="user", tool_calls=[tool_call]))
        else:
            messages.append(message.AssistantMessage(role="assistant", tool_calls=[tool_call]))
        response = env.get_response(tool_call)
        errors += response.error
        messages.append(response)
    else:
        if solo:  # no done: the agent's last (text) turn ends the run as an agent error
            ending = reason.AGENT_ERROR
    if not solo:
        if trajectory.ending == "cut":  # the run did not end: τ² would have gone on to its step limit
            ending = reason.MAX_STEPS
        else:
            texts = trajectory.texts if trajectory.sent is None else trajectory.sent
            messages += [message.AssistantMessage(role="assistant", content=t) for t in texts]
            if trajectory.ending == "user":
                messages.append(message.UserMessage(role="user", content="###STOP###"))
                ending = reason.USER_STOP
    if errors >= MAX_ERRORS:  # the orchestrator's check after each batch of results
        ending = reason.TOO_MANY_ERRORS
    run = simulation.SimulationRun(
        id=uuid.uuid4().hex,
        task_id=task_id,
        start_time="",
        end_time="",
        duration=0.0,
        termination_reason=ending,
        messages=messages,
    )
    evaluation = importlib.import_module("tau2.evaluator.evaluator")
    try:
        info = evaluate_simulation(run, task, evaluation.EvaluationType.ALL, solo, domain)
    except Exception as exc:  # noqa: BLE001 - τ²'s run_tasks (skip_failed_samples): the sample scores 0.0
        return 0.0, exc
    return info.reward, info


def _tau2_evaluator() -> tuple[Any, Any]:
    """τ²'s ``evaluate_simulation`` and the registry it reads.

    Its module imports litellm (left out of this project: see pyproject.toml) two ways:
    through τ²'s registry, which imports every agent, and through the NL-assertion
    evaluator's LLM call. ``EvaluationType.ALL`` uses neither: of the registry only
    ``get_env_constructor(domain)``, which is what τ²'s registry registers for each domain
    (``register_domain`` in tau2/registry.py); of the LLM module nothing. So the module is
    loaded against a registry that holds exactly those constructors (each over a fresh copy of
    the package's DBs, loaded once: ``reference.py``) and an LLM module whose
    ``generate`` refuses; both are taken out of ``sys.modules`` again after the import.
    """
    if "tau2.evaluator.evaluator" not in sys.modules:

        class Registry:
            def get_env_constructor(self, name: str) -> Any:
                # register_domain's get_environment (telecom's manual policy): reference.py
                return functools.partial(reference.environment, name)

        def generate(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("no LLM here: NL assertions are not evaluated (EvaluationType.ALL)")

        registry = types.ModuleType("tau2.registry")
        registry.registry = Registry()  # type: ignore[attr-defined]
        llm = types.ModuleType("tau2.utils.llm_utils")
        llm.generate = generate  # type: ignore[attr-defined]
        stand_ins = {"tau2.registry": registry, "tau2.utils.llm_utils": llm}
        real = {name: sys.modules.get(name) for name in stand_ins}
        sys.modules.update(stand_ins)
        try:
            importlib.import_module("tau2.evaluator.evaluator")
        finally:
            for name, module in real.items():
                if module is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = module
    module = sys.modules["tau2.evaluator.evaluator"]
    return module.evaluate_simulation, module.registry


def outcome(
    url: str, pack: Pack, domain: str, task: EnvTask, trajectory: Trajectory, prefix: str = ""
) -> Outcome:
    """Score one trajectory both ways: τ² runs every call, those our server refused on their
    schema too (it checks none)."""
    ours = served(url, pack, task, trajectory, prefix)
    tau2_id = task.metadata["tau2_id"]
    solo = bool(task.metadata.get("tau2_solo"))
    theirs, info = tau2_reward(domain, tau2_id, trajectory, solo=solo)
    crashed = isinstance(info, Exception)
    without = tau2_reward(domain, tau2_id, trajectory, ours.ran, solo=solo)[0] if ours.refused else None
    return Outcome(
        domain,
        task.id,
        trajectory.kind,
        theirs,
        ours.score,
        ours.refused,
        without,
        str(ours.details.get("benchmark", {}).get("reason") or ""),
        crashed,
        ours.components,
    )
