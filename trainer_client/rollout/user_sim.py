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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["STOP_SIGNALS", "UserReply", "scenario_of", "simulator_messages", "system_prompt", "user_reply"]

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


def system_prompt(scenario: str) -> str:
    """The simulator's system text: the guidelines, then the scenario."""
    return f"{GUIDELINES}\n\n<scenario>\n{scenario.strip()}\n</scenario>"


def simulator_messages(scenario: str, conversation: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The chat the simulator answers: its system prompt, then ``conversation`` as the
    customer saw it, roles flipped.

    An agent message followed by tool results was a tool-call turn: the customer never
    saw it. System text (the agent's policy) and tool results are left out likewise.
    """
    chat: list[dict[str, Any]] = [{"role": "system", "content": system_prompt(scenario)}]
    for i, message in enumerate(conversation):
        role, content = message.get("role"), message.get("content")
        if not isinstance(content, str) or not content.strip():
            continue
        if role == "user":
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
