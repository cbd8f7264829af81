"""What a rollout consumes and produces: its config, its tasks, its trajectories.

``RolloutCore`` (``rollout``) turns a ``Task`` into a ``Trajectory`` under a
``RolloutConfig``, through a ``ToolInvoker`` and optionally a ``Verifier``; these records
carry no behaviour, so trainers, the CLI and the workbench can use them without the core.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypedDict, runtime_checkable

import protocol

__all__ = [
    "TRUNCATION_MARKER",
    "CallRecord",
    "RolloutConfig",
    "StopReason",
    "Task",
    "ToolInvoker",
    "Trajectory",
    "Verifier",
    "task_environment",
]

TRUNCATION_MARKER = "\n...[truncated {n} tokens]"


@runtime_checkable
class ToolInvoker(Protocol):
    """Runs tool calls for the rollout. Results come back one per call, in order.

    Optional: ``lease_session(session_id)`` (sync), called when a trajectory starts, keeps
    its session open on the server until ``release_session`` however long generation takes
    (``ToolClient`` has it); ``create_session(session_id, environment=...)`` binds a session
    to an environment task.
    """

    async def call_tools(self, calls: list[protocol.Call]) -> list[protocol.Result]: ...

    async def release_session(self, session_id: str) -> None: ...


@runtime_checkable
class Verifier(Protocol):
    """Scores finished trajectories (e.g. the tool server's ``/v1/verify``)."""

    async def verify(self, requests: list[protocol.VerifyRequest]) -> list[protocol.VerifyResult]: ...


class StopReason(StrEnum):
    """Why a trajectory ended."""

    ANSWER = "answer"  # the model gave a final <answer>
    EOS = "eos"  # the model ended its turn (EOS) without a call or an answer
    MAX_TURNS = "max_turns"  # the turn budget ran out while the model was still calling tools
    LENGTH = "length"  # the response-length budget (or a turn's max_tokens) ran out
    NO_TOOL_CALL = "no_tool_call"  # generation stopped without EOS, call or answer
    ERROR = "error"  # generation, a tool invocation or the renderer failed (see Trajectory.error)
    USER_STOP = "user_stop"  # the simulated user ended the conversation (a stop signal)
    MAX_USER_TURNS = "max_user_turns"  # the simulated user had said all it may (max_user_turns)
    USER_ERROR = "user_error"  # the simulated user could not be asked (see Trajectory.error)
    # The session's state is gone (its replica died or restarted, or it expired): the rest
    # of the trajectory would run against an empty world, so it ends unscored (see error).
    SESSION_LOST = "session_lost"


@dataclass
class RolloutConfig:
    """Everything that shapes a rollout. Budgets are per trajectory unless noted.

    ``max_obs_tokens`` bounds the content tokens of one observation turn (the tool
    results of that turn together, template tokens not counted): longer results are
    cut, to within a token or two, and end with a visible ``truncation_marker``.
    ``response_length`` bounds all response tokens (model + observation), as veRL's
    ``rollout.response_length``. ``tool_result_template`` None renders results
    as ``tool`` messages with the chat template; a text template such as
    ``templates.SEARCH_R1_TEMPLATE`` (or ``"search_r1"``) puts them inside the assistant
    turn. ``toolset`` names the server toolset; the invoker is built for it (the core
    only records it).

    ``user_tool`` is the server tool that plays a task's simulated user (the ``llm``
    model tool, or any tool taking ``messages`` and answering text); ``max_user_turns``
    bounds the simulated user's messages per trajectory. Tasks without a user scenario
    never call it.

    ``mm_processor_kwargs`` go to every call of a VLM's processor (``min_pixels``,
    ``max_pixels``, ...): set them as veRL's ``data.mm_processor_kwargs``.
    """

    format: str = "hermes"
    parser_options: dict[str, Any] = field(default_factory=dict)
    max_turns: int = 4
    max_calls_per_turn: int = 4
    max_obs_tokens: int = 512
    response_length: int = 1024
    sampling_params: dict[str, Any] = field(default_factory=lambda: {"temperature": 1.0, "top_p": 1.0})
    tool_result_template: str | None = None
    toolset: str | None = None
    verifier: str | None = None
    verifier_arguments: dict[str, Any] = field(default_factory=dict)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    truncation_marker: str = TRUNCATION_MARKER
    user_tool: str = "llm"
    max_user_turns: int = 10
    mm_processor_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.user_tool, str) or not self.user_tool:
            raise ValueError(f"RolloutConfig.user_tool must name a server tool, got {self.user_tool!r}")
        for name in (
            "max_turns",
            "max_calls_per_turn",
            "max_obs_tokens",
            "response_length",
            "max_user_turns",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"RolloutConfig.{name} must be a positive integer, got {value!r}")


@dataclass
class Task:
    """One prompt to roll out. ``tools`` are JSON tool schemas given to the chat template.

    ``user_turns`` are the user's later messages of a multi-turn conversation (BFCL
    multi-turn: ``metadata["turns"]`` from the dataset), each a list of messages: when the
    model ends a turn without calling a tool, the next one is spliced in (mask 0) and
    the model goes on, until none is left. ``user_scenario`` (from ``extra_info.user_sim``)
    gives the task a simulated user, asked for each later message once the static turns
    are spent, until it sends a stop signal or ``RolloutConfig.max_user_turns`` is reached.
    ``new_tools[i]`` (JSON tool schemas) become available with ``user_turns[i]``: until
    then a call to one of them is refused as an unknown tool. ``metadata["verifier_arguments"]``
    (a row's ``extra_info``), when given, replace ``RolloutConfig.verifier_arguments``.
    """

    messages: list[dict[str, Any]]
    ground_truth: Any = None
    tools: list[dict[str, Any]] | None = None
    verifier: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    user_turns: list[list[dict[str, Any]]] = field(default_factory=list)
    user_scenario: str | None = None
    new_tools: list[list[dict[str, Any]]] = field(default_factory=list)


@dataclass
class Trajectory:
    """One finished rollout, shaped like veRL's ``AgentLoopOutput`` (plus inspection data).

    ``response_mask`` is 1 for model tokens and 0 for observation/template tokens;
    ``response_logprobs`` holds the sampling log-probs of model tokens and 0.0 elsewhere.
    ``num_turns`` counts as veRL does: 1 (the prompt) + assistant turns + observation turns.
    ``calls`` has one ``CallRecord`` per tool call the rollout made or refused, in order;
    ``reward_details`` is the verifier's ``details`` (what it matched, per component).
    ``images`` are the images the model saw (Pillow images, in the order of their image
    tokens in ``prompt_ids + response_ids``): veRL's ``multi_modal_data["images"]``.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    num_turns: int
    stop_reason: StopReason
    session_id: str
    messages: list[dict[str, Any]]
    final_answer: str | None = None
    reward_score: float | None = None
    reward_components: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    task: Task | None = None
    calls: list[CallRecord] = field(default_factory=list)
    reward_details: dict[str, Any] = field(default_factory=dict)
    images: list[Any] = field(default_factory=list)


class CallRecord(TypedDict):
    """One tool call of a trajectory, for inspection (the workbench, ``trainer-client show``).

    ``message`` is the index in ``Trajectory.messages`` of the tool message with its result
    (past the end when the response-length budget cut the turn before the splice);
    ``elapsed_ms`` and ``cached`` are the server's; ``error`` is the error kind, or None.
    """

    turn: int
    message: int
    name: str
    elapsed_ms: float
    cached: bool
    error: str | None


def task_environment(task: Task) -> dict[str, str] | None:
    """The environment task a rollout plays, ``{"pack", "task"}``: from the task's metadata
    (a dataset row's ``extra_info``), else from a ground truth of that shape."""
    for source in (task.metadata, task.ground_truth):
        if (
            isinstance(source, dict)
            and isinstance(source.get("pack"), str)
            and isinstance(source.get("task"), str)
        ):
            return {"pack": source["pack"], "task": source["task"]}
    return None


async def bind_session(invoker: Any, session_id: str, task: Task) -> None:
    """Bind the session to the task's environment task (if any) before its first call, so
    that its world starts from the task's state: whoever calls first, the agent or the
    simulated user."""
    environment = task_environment(task)
    if environment is None:
        return
    bind = getattr(invoker, "create_session", None)
    if bind is None:
        raise RuntimeError(
            f"the task plays {environment} but the tool invoker cannot bind a session "
            "(it needs create_session(session, environment=...), as ToolClient has)"
        )
    await bind(session_id, environment=environment)
