"""A simulated user: an LLM plays the user of a task's scenario, reached as a server tool.

τ²-bench tasks are conversations with a customer whose goal, facts and manner are
written down as a *scenario*. When the agent ends a turn without calling a tool, the
rollout core asks the simulator for the customer's next message. The simulator is the
tool server's ``llm`` model tool (any OpenAI-compatible endpoint, configured on the
server), called through the same batched client as every other tool: the trainer never
talks to the endpoint itself.

The simulator sees the conversation from the customer's side, as τ²'s own simulator
does: a system prompt with the guidelines and the scenario, then the chat with the
roles flipped (the customer's own messages are its ``assistant`` turns, the agent's
replies its ``user`` turns). It sees only what a customer would: the agent's tool-call
turns, tool results and the agent's system text are left out. It ends the conversation
with a stop signal (τ²'s tokens, so a simulator prompted for τ² behaves the same here).

A user may have tools of its own (τ²'s dual control: the customer's phone;
``extra_info.user_sim.tools``, MCP descriptors). The simulator is then asked with them as
OpenAI ``tools`` and may answer with tool calls instead of a message: ``user_turns`` runs
them on the trajectory's world (as the user's calls) and hands the results back to the
simulator, never to the agent, as τ²'s orchestrator does. In the simulator's chat its own
calls are its ``assistant`` turns with ``tool_calls``, their results ``tool`` messages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainer_client.templates.tools import openai_tool_schemas

__all__ = [
    "STOP_SIGNALS",
    "UserReply",
    "scenario_of",
    "simulator_messages",
    "system_prompt",
    "user_reply",
    "user_tools_of",
]

USER = "user"  # the requestor of the simulated user's own tool calls (τ²'s word)
STOP = "###STOP###"
TRANSFER = "###TRANSFER###"
OUT_OF_SCOPE = "###OUT-OF-SCOPE###"
STOP_SIGNALS = (STOP, TRANSFER, OUT_OF_SCOPE)

GUIDELINES = f"""\
You are role-playing a customer who has contacted a customer-service agent. The scenario \
below says who you are, what you want and what you know. The agent's messages reach you as \
user messages; your replies are the customer's messages.

How to play the customer:
- Write one message at a time, short and natural, the way a person types into a chat.
- Keep to the scenario. Anything it does not tell you, you do not know: say so rather than \
invent it.
- Do not read the scenario out. Put things in your own words, and give details (names, \
numbers, order ids) only when the agent asks for them.
- Stay in character for the whole conversation; never mention these instructions.

Ending the conversation (write the token on its own, as your whole message):
- {STOP} when what you wanted is done, or cannot be done and you accept that;
- {TRANSFER} when the agent transfers you to another agent or a human;
- {OUT_OF_SCOPE} when the agent needs something the scenario gives you no way to answer."""

TOOL_GUIDELINES = """You have tools that act on your side (your own device), for what the agent asks you to do or check:
- Each turn, either write a message to the agent or make a tool call, never both.
- Call a tool only when the agent asks for that action, or to answer what the agent asked; if you do not know which action is meant, ask the agent.
- One action at a time: if the agent asks for several, say you can do one at a time.
- Never make up a tool's result: tell the agent what it actually returned.
- If a tool call fails, fix it and try again.
- The agent does not see your tool calls or their results, only your messages."""


@dataclass(frozen=True)
class UserReply:
    """The simulated user's next message; ``stop`` is the stop signal it sent, if any."""

    text: str
    stop: str | None = None


def scenario_of(metadata: Mapping[str, Any]) -> str | None:
    """The simulated user's scenario of a dataset row's ``extra_info`` (``user_sim.scenario``)."""
    user = metadata.get("user_sim")
    scenario = user.get("scenario") if isinstance(user, Mapping) else None
    return scenario if isinstance(scenario, str) and scenario.strip() else None


def user_tools_of(metadata: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The simulated user's own tools of a row's ``extra_info`` (``user_sim.tools``), as the
    OpenAI ``tools`` the simulator is asked with; empty for a user who only talks."""
    user = metadata.get("user_sim")
    tools = user.get("tools") if isinstance(user, Mapping) else None
    return openai_tool_schemas(tools) if isinstance(tools, list) else []


def system_prompt(scenario: str, tools: bool = False) -> str:
    """The simulator's system text: the guidelines (with those for its tools), then the scenario."""
    guidelines = f"{GUIDELINES}\n\n{TOOL_GUIDELINES}" if tools else GUIDELINES
    return f"{guidelines}\n\n<scenario>\n{scenario.strip()}\n</scenario>"


def simulator_messages(
    scenario: str, conversation: Sequence[Mapping[str, Any]], *, tools: bool = False
) -> list[dict[str, Any]]:
    """The chat the simulator answers: its system prompt, then ``conversation`` as the
    customer saw it, roles flipped.

    An agent message followed by tool results was a tool-call turn: the customer never
    saw it. System text (the agent's policy) and the agent's tool results are left out
    likewise. The user's own tool calls (a user message with ``tool_calls``) are its
    assistant turns, and their results (tool messages of ``requestor`` user) stay.
    """
    chat: list[dict[str, Any]] = [{"role": "system", "content": system_prompt(scenario, tools)}]
    for i, message in enumerate(conversation):
        role, content = message.get("role"), message.get("content")
        if role == "user" and message.get("tool_calls"):
            text = content if isinstance(content, str) and content.strip() else None
            chat.append({"role": "assistant", "content": text, "tool_calls": list(message["tool_calls"])})
        elif role == "tool" and message.get("requestor") == USER:
            chat.append(
                {"role": "tool", "tool_call_id": message.get("tool_call_id"), "content": str(content or "")}
            )
        elif not isinstance(content, str) or not content.strip():
            continue
        elif role == "user":
            chat.append({"role": "assistant", "content": content})
        elif role == "assistant" and not _calls_tools(conversation, i):
            chat.append({"role": "user", "content": content})
    return chat


def user_reply(text: str) -> UserReply:
    """The simulator's answer read as a user message: a stop signal anywhere in it ends
    the conversation (τ² reads it the same way)."""
    stop = next((signal for signal in STOP_SIGNALS if signal in text), None)
    return UserReply(text=text.strip(), stop=stop)


def _calls_tools(conversation: Sequence[Mapping[str, Any]], index: int) -> bool:
    message = conversation[index]
    if message.get("tool_calls"):
        return True
    following = conversation[index + 1] if index + 1 < len(conversation) else None
    return following is not None and following.get("role") == "tool"
