"""The simulated user's view of the conversation when it has tools of its own (τ² dual control).

Its own tool calls are its assistant turns with ``tool_calls`` and their results stay in its
chat (as τ²'s ``UserState.flip_roles``); the agent's calls and results never reach it.
"""

from __future__ import annotations

from trainer_client.rollout.user_sim import TOOL_GUIDELINES, simulator_messages, user_tools_of

CALL = {"id": "c1", "type": "function", "function": {"name": "toggle_roaming", "arguments": "{}"}}
CONVERSATION = [
    {"role": "system", "content": "The agent's policy."},
    {"role": "user", "content": "Hi! I need some help, please."},
    {"role": "assistant", "content": '<tool_call>{"name": "get_customer_by_phone"}</tool_call>'},
    {"role": "tool", "name": "get_customer_by_phone", "content": "{'customer_id': 'C1'}"},
    {"role": "assistant", "content": "Please turn roaming on."},
    {"role": "user", "content": "", "tool_calls": [CALL]},
    {
        "role": "tool",
        "name": "toggle_roaming",
        "content": "Roaming is ON.",
        "requestor": "user",
        "tool_call_id": "c1",
    },
]


def test_the_users_own_calls_and_results_stay_in_its_chat_the_agents_do_not() -> None:
    chat = simulator_messages("Your roaming is off.", CONVERSATION, tools=True)
    assert TOOL_GUIDELINES in chat[0]["content"] and "Your roaming is off." in chat[0]["content"]
    assert chat[1:] == [
        {"role": "assistant", "content": "Hi! I need some help, please."},
        {"role": "user", "content": "Please turn roaming on."},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "Roaming is ON."},
    ]
    assert (
        TOOL_GUIDELINES not in simulator_messages("s", CONVERSATION[:2])[0]["content"]
    )  # a user who only talks


def test_the_users_tools_come_from_the_row_as_openai_schemas() -> None:
    descriptor = {"name": "t_toggle_roaming", "description": "Toggle.", "inputSchema": {"type": "object"}}
    assert user_tools_of({"user_sim": {"scenario": "s", "tools": [descriptor]}}) == [
        {
            "type": "function",
            "function": {
                "name": "t_toggle_roaming",
                "description": "Toggle.",
                "parameters": {"type": "object"},
            },
        }
    ]
    assert user_tools_of({"user_sim": {"scenario": "s"}}) == [] and user_tools_of({}) == []
