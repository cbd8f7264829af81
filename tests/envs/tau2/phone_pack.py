"""A tiny pack whose task gives its simulated user a tool of its own (as τ²'s dual control does).

``pack()`` is a source (``tests.envs.tau2.phone_pack:pack``): one world with a line and a
phone; the agent's tool reads the line, the user's (``metadata["user_tools"]``) switches the
phone on. Nothing of τ² in it: it shows the server's rule for any pack.
"""

from __future__ import annotations

from typing import Any

from tools.envs.pack import EnvTask, EnvTool, Gold, GoldCall, Pack, PackInfo
from tools.envs.world import World

EMPTY = {"type": "object", "properties": {}, "additionalProperties": False}


def check_line(world: World) -> dict[str, Any]:
    return {"line": "active", "phone_on": world["device"].peek("phone")["on"]}


def switch_phone_on(world: World) -> str:
    world["device"]["phone"]["on"] = True
    return "the phone is on"


TOOLS = [
    EnvTool("check_line", "The line's status, as the agent sees it.", EMPTY, check_line),
    EnvTool(
        "switch_phone_on", "Switch the phone on (the user's own action).", EMPTY, switch_phone_on, writes=True
    ),
]


def pack() -> Pack:
    task = EnvTask(
        id="phone_off",
        prompt=[{"role": "user", "content": "My phone does not work."}],
        gold=Gold(calls=[GoldCall("switch_phone_on")]),
        user_scenario="Your phone is off; switch it on when the agent asks.",
        metadata={"user_tools": ["switch_phone_on"]},
    )
    return Pack(PackInfo(id="phone"), TOOLS, {"device": {"phone": {"on": False}}}, [task])
