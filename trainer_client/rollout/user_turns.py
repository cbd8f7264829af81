"""The user's later turns of a conversation: a task's static turns, then its simulated user.

When the model ends a turn without a call and the user may speak, ``RolloutCore`` splices
the user's next message(s) like an observation (mask 0): a static turn of the task while any
is left (``Task.user_turns``, announcing the tools it makes available), else the simulated
user's answer (``Task.user_scenario``, see ``user_sim``) asked through ``user_tool``.

A simulated user with tools of its own (τ²'s dual control, ``user_sim.user_tools_of``) may
answer with tool calls first: they run through the same invoker, in the trajectory's
session, with user call ids (``protocol.messages.new_user_call_id``: the server lets only
those reach the user's tools), and their results go back to the simulator, which is asked
again, until it writes a message for the agent. The calls and results are recorded in the
trajectory's messages (a user message with ``tool_calls``, tool messages with ``requestor``
``user``), where the verifier reads them, but never spliced: the agent does not see them.
"""

from __future__ import annotations

import json
import time
from typing import Any

import protocol
from protocol.messages import new_user_call_id
from trainer_client.rollout.observations import announce_tools, result_text
from trainer_client.rollout.state import TrajectoryState
from trainer_client.rollout.types import RolloutConfig, StopReason, ToolInvoker, bind_session
from trainer_client.rollout.user_sim import USER, simulator_messages, user_reply, user_tools_of

__all__ = ["MAX_TOOL_ROUNDS", "UserTurns"]

# Tool-call answers the simulated user may give in a row before it must write to the agent
# (τ²'s own bound is its run's 200 steps; a user that only ever calls tools would spin here).
MAX_TOOL_ROUNDS = 16


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
        tools = user_tools_of(s.task.metadata)
        rounds = 0  # tool-call answers in a row
        while True:
            answer = await self._ask(s, tools)
            if answer is None:
                return None
            text, calls = answer
            if not calls:
                break
            if rounds == MAX_TOOL_ROUNDS:
                return self._failed(
                    s, f"it answered with tool calls {rounds + 1} times in a row, never writing"
                )
            rounds += 1
            if not await self._act(s, text, calls):
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

    async def _ask(
        self, s: TrajectoryState, tools: list[dict[str, Any]]
    ) -> tuple[str, list[dict[str, Any]]] | None:
        """The simulated user's answer to the conversation so far, through ``user_tool``: its
        text and its tool calls (OpenAI form; none for a user without tools).

        Without the trajectory's session: the simulator is a model, and the session belongs
        to the task's world, which the user's own tools reach through ``_act``."""
        assert s.task.user_scenario is not None
        arguments: dict[str, Any] = {
            "messages": simulator_messages(s.task.user_scenario, s.messages, tools=bool(tools))
        }
        if tools:
            arguments["tools"] = tools
        results = await self._call(
            s, [protocol.Call(protocol.new_call_id(), self.config.user_tool, arguments, None)]
        )
        if results is None:
            return None
        (result,) = results
        if result.is_error:
            return self._failed(s, result_text(result) or "an error without a message")
        structured = result.structured if isinstance(result.structured, dict) else {}
        calls = structured.get("tool_calls") if tools else None
        return result_text(result), list(calls) if isinstance(calls, list) else []

    async def _act(self, s: TrajectoryState, text: str, calls: list[dict[str, Any]]) -> bool:
        """Run the simulated user's tool calls in the trajectory's world, as the user; record
        them and their results for the simulator and the verifier. False when the trajectory
        cannot go on (the session is lost, or the invoker failed)."""
        s.messages.append({"role": "user", "content": text, "tool_calls": calls})
        runnable: list[tuple[int, protocol.Call]] = []
        answers: list[dict[str, Any]] = []
        for i, call in enumerate(calls):
            call = call if isinstance(call, dict) else {}
            name, arguments = _name_and_arguments(call.get("function"))
            answer = {"role": "tool", "tool_call_id": call.get("id"), "requestor": USER}
            if isinstance(arguments, str):  # not run: the simulator learns what was wrong
                answers.append({**answer, "content": arguments})
                continue
            answers.append({**answer, "name": name})
            runnable.append((i, protocol.Call(new_user_call_id(), name, arguments, s.session_id)))
        if runnable:
            if not s.bound:
                await self._bind(s)
            results = await self._call(s, [call for _, call in runnable])
            if results is None:
                return False
            for (i, _), result in zip(runnable, results, strict=True):
                answers[i]["content"] = result_text(result)
                s.metrics["user_tool_errors"] = s.metrics.get("user_tool_errors", 0) + result.is_error
                s.note_lost_session(result.error)
        s.metrics["user_calls"] = s.metrics.get("user_calls", 0) + len(calls)
        s.messages.extend(answers)
        return s.stop_reason != StopReason.SESSION_LOST

    async def _call(self, s: TrajectoryState, calls: list[protocol.Call]) -> list[protocol.Result] | None:
        """``calls`` through the invoker, one result each; None (the trajectory failed, saying
        why) when the client itself fails."""
        started = time.perf_counter()
        try:
            results = await self.invoker.call_tools(calls)
        except Exception as exc:  # the client's own failure: the conversation cannot go on
            return self._failed(s, f"{type(exc).__name__}: {exc}")
        finally:
            s.metrics["user_s"] += time.perf_counter() - started
        if len(results) != len(calls):
            return self._failed(s, f"the tool invoker returned {len(results)} results for {len(calls)} calls")
        return list(results)

    async def _bind(self, s: TrajectoryState) -> None:
        s.bound = True
        await bind_session(self.invoker, s.session_id, s.task)

    def _failed(self, s: TrajectoryState, why: str) -> None:
        s.stop_reason = StopReason.USER_ERROR
        s.error = f"the simulated user (server tool {self.config.user_tool!r}) failed: {why}"


def _name_and_arguments(function: Any) -> tuple[str, dict[str, Any] | str]:
    """A tool call's name and arguments (OpenAI form: arguments as JSON text), or, in place
    of the arguments, the error message for a call that cannot be sent."""
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        return "", "Error: a tool call needs a function name"
    raw = function.get("arguments")
    try:
        arguments = json.loads(raw) if isinstance(raw, str) and raw.strip() else (raw or {})
    except json.JSONDecodeError as exc:
        return function["name"], f"Error: the arguments are not valid JSON ({exc})"
    if not isinstance(arguments, dict):
        return function["name"], "Error: the arguments must be a JSON object"
    return function["name"], arguments
