"""The mutable state of one trajectory while ``RolloutCore`` runs it.

One ``TrajectoryState`` per ``RolloutCore.run``: the token ids and masks so far, the
messages, the tools available now, the budgets spent and the metrics. ``to_trajectory``
freezes it into the ``Trajectory`` the caller gets.
"""

from __future__ import annotations

from typing import Any

import protocol
from trainer_client.rollout.types import CallRecord, StopReason, Task, Trajectory

__all__ = ["TrajectoryState", "tool_name"]


def tool_name(schema: dict[str, Any]) -> str:
    """The name in a JSON tool schema (``{"type": "function", "function": {...}}`` or flat)."""
    spec = schema.get("function") if isinstance(schema.get("function"), dict) else schema
    return str(spec.get("name") or "")


class TrajectoryState:
    """Mutable per-trajectory state."""

    __slots__ = (
        "task",
        "session_id",
        "bound",
        "next_user_turn",
        "simulated_turns",
        "tools",
        "hidden",
        "prompt_ids",
        "response_ids",
        "response_mask",
        "response_logprobs",
        "messages",
        "assistant_turns",
        "observation_turns",
        "stop_reason",
        "final_answer",
        "reward_score",
        "reward_components",
        "reward_details",
        "calls",
        "images",
        "error",
        "metrics",
    )

    def __init__(self, task: Task, session_id: str) -> None:
        self.task = task
        self.session_id = session_id
        self.bound = False  # the session was bound to its environment task (if it has one)
        self.next_user_turn = 0  # index into task.user_turns
        self.simulated_turns = 0  # messages of the simulated user spliced in
        self.tools: list[dict[str, Any]] = list(task.tools or [])  # the tools available now
        shown = {tool_name(t) for t in self.tools}
        self.hidden = {tool_name(t) for turn in task.new_tools for t in turn} - shown  # not yet available
        self.prompt_ids: list[int] = []
        self.response_ids: list[int] = []
        self.response_mask: list[int] = []
        self.response_logprobs: list[float] = []
        self.messages: list[dict[str, Any]] = list(task.messages)
        self.assistant_turns = 0
        self.observation_turns = 0
        self.stop_reason = StopReason.ERROR
        self.final_answer: str | None = None
        self.reward_score: float | None = None
        self.reward_components: dict[str, float] = {}
        self.reward_details: dict[str, Any] = {}
        self.calls: list[CallRecord] = []
        self.images: list[Any] = []  # decoded, in the order of their image tokens
        self.error: str | None = None
        self.metrics: dict[str, Any] = {
            "generate_s": 0.0,
            "tool_s": 0.0,
            "client_s": 0.0,
            "calls": 0,
            "tool_errors": 0,
            "parse_errors": 0,
            "dropped_calls": 0,
            "truncated_observations": 0,
            "user_turns": 0,
            "user_s": 0.0,
            "refused_calls": 0,
        }

    def reveal(self, schemas: list[dict[str, Any]]) -> None:
        """Make ``schemas`` available from now on (a user turn announced them)."""
        self.tools = self.tools + list(schemas)
        self.hidden -= {tool_name(t) for t in schemas}

    def append(self, ids: list[int], mask: int, log_probs: list[float] | None) -> None:
        self.response_ids += ids
        self.response_mask += [mask] * len(ids)
        self.response_logprobs += log_probs if log_probs is not None else [0.0] * len(ids)

    def note_lost_session(self, error: protocol.ErrorInfo | None) -> None:
        """End the trajectory when the server no longer holds its session (``unknown_session``)."""
        if error is not None and error.kind == protocol.ErrorKind.UNKNOWN_SESSION and self.error is None:
            self.stop_reason = StopReason.SESSION_LOST
            self.error = error.message

    def to_trajectory(self) -> Trajectory:
        self.metrics["assistant_turns"] = self.assistant_turns
        self.metrics["observation_turns"] = self.observation_turns
        return Trajectory(
            prompt_ids=self.prompt_ids,
            response_ids=self.response_ids,
            response_mask=self.response_mask,
            response_logprobs=self.response_logprobs,
            num_turns=1 + self.assistant_turns + self.observation_turns,
            stop_reason=self.stop_reason,
            session_id=self.session_id,
            messages=self.messages,
            final_answer=self.final_answer,
            reward_score=self.reward_score,
            reward_components=self.reward_components,
            metrics=self.metrics,
            error=self.error,
            task=self.task,
            calls=self.calls,
            reward_details=self.reward_details,
            images=self.images,
        )
