"""The user's later turns of a conversation: a task's static turns, then its simulated user.

When the model ends a turn without a call and the user may speak, ``RolloutCore`` splices
the user's next message(s) like an observation (mask 0): a static turn of the task while any
is left (``Task.user_turns``, announcing the tools it makes available), else the simulated
user's answer (``Task.user_scenario``, see ``user_sim``) asked through ``user_tool``.
"""

from __future__ import annotations

import time
from typing import Any

import protocol
from trainer_client.rollout.observations import announce_tools, result_text
from trainer_client.rollout.state import TrajectoryState
from trainer_client.rollout.types import RolloutConfig, StopReason, ToolInvoker
from trainer_client.rollout.user_sim import simulator_messages, user_reply

__all__ = ["UserTurns"]


class UserTurns:
    """The user's side of a rollout: whether it speaks next, and what it says."""

    def __init__(self, invoker: ToolInvoker, config: RolloutConfig) -> None:
        self.invoker = invoker
        self.config = config  # user_tool, max_user_turns

    def may_speak(self, s: TrajectoryState) -> bool:
        if s.next_user_turn < len(s.task.user_turns):
            return True
        return bool(s.task.user_scenario) and s.simulated_turns < self.config.max_user_turns

    async def next(self, s: TrajectoryState) -> list[dict[str, Any]] | None:
        """The user's next message(s): a static turn while any is left, else the simulated
        user's. None when the simulated user ends the conversation or cannot be asked."""
        if s.next_user_turn < len(s.task.user_turns):
            turn = [dict(m) for m in s.task.user_turns[s.next_user_turn]]
            added = s.task.new_tools[s.next_user_turn] if s.next_user_turn < len(s.task.new_tools) else []
            s.next_user_turn += 1
            s.metrics["user_turns"] += 1
            if added:
                s.reveal(added)
                turn[-1] = dict(turn[-1], content=str(turn[-1].get("content") or "") + announce_tools(added))
            return turn
        text = await self._ask(s)
        if text is None:
            return None
        reply = user_reply(text)
        if not reply.text:
            return self._failed(s, "it answered with an empty message")
        if reply.stop is not None:  # recorded, not spliced: no model turn follows it
            s.messages.append({"role": "user", "content": reply.text})
            s.metrics["user_stop"] = reply.stop
            s.stop_reason = StopReason.USER_STOP
            return None
        s.simulated_turns += 1
        s.metrics["user_turns"] += 1
        return [{"role": "user", "content": reply.text}]

    async def _ask(self, s: TrajectoryState) -> str | None:
        """The simulated user's answer to the conversation so far, through ``user_tool``.

        Stateless and without the trajectory's session: the session belongs to the
        task's world, which the user never touches."""
        assert s.task.user_scenario is not None
        arguments = {"messages": simulator_messages(s.task.user_scenario, s.messages)}
        call = protocol.Call(protocol.new_call_id(), self.config.user_tool, arguments, None)
        started = time.perf_counter()
        try:
            results = await self.invoker.call_tools([call])
        except Exception as exc:  # the client's own failure: the conversation cannot go on
            return self._failed(s, f"{type(exc).__name__}: {exc}")
        finally:
            s.metrics["user_s"] += time.perf_counter() - started
        if len(results) != 1:
            return self._failed(s, f"the tool invoker returned {len(results)} results for 1 call")
        (result,) = results
        if result.is_error:
            return self._failed(s, result_text(result) or "an error without a message")
        return result_text(result)

    def _failed(self, s: TrajectoryState, why: str) -> None:
        s.stop_reason = StopReason.USER_ERROR
        s.error = f"the simulated user (server tool {self.config.user_tool!r}) failed: {why}"
