"""A tiny hand-written environment pack for tests: a shop with users, orders and products.

``pack()`` is a source (``tests.support.env_pack:pack``); ``TOOLS`` lets ``dump_pack`` and
``load_pack`` use this module as a directory pack's tools. ``pack(broken=True)`` adds
tasks that ``tool-server env validate`` must reject.
"""

from __future__ import annotations

from typing import Any

from protocol import ErrorKind, ToolError
from tools.envs import Complexity, EnvTask, EnvTool, Gold, GoldCall, Pack, PackInfo, World

POLICY = "You are the shop's assistant. Cancel only orders that are still pending."


def _order(world: World, order_id: str) -> dict[str, Any]:
    try:
        return world["orders"][order_id]
    except KeyError:
        raise ToolError(f"no order {order_id!r}", ErrorKind.INVALID_ARGUMENTS) from None


def get_user(world: World, user_id: str) -> dict[str, Any]:
    user = world["users"].peek(user_id)
    if user is None:
        raise ToolError(f"no user {user_id!r}")
    return dict(user)


def get_order(world: World, order_id: str) -> dict[str, Any]:
    return _order(world, order_id)


def cancel_order(world: World, order_id: str, reason: str = "") -> dict[str, Any]:
    order = _order(world, order_id)
    if order["status"] != "pending":
        raise ToolError(f"order {order_id} is {order['status']}: only pending orders can be cancelled")
    order["status"] = "cancelled"
    order["reason"] = reason
    return order


def delete_order(world: World, order_id: str) -> str:
    _order(world, order_id)
    del world["orders"][order_id]
    return f"deleted {order_id}"


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


ID = {"type": "string", "minLength": 1}
TOOLS = [
    EnvTool("get_user", "Look a user up by id.", _schema({"user_id": ID}, ["user_id"]), get_user),
    EnvTool("get_order", "Look an order up by id.", _schema({"order_id": ID}, ["order_id"]), get_order),
    EnvTool(
        "cancel_order",
        "Cancel a pending order.",
        _schema({"order_id": ID, "reason": {"type": "string"}}, ["order_id"]),
        cancel_order,
        writes=True,
    ),
    EnvTool(
        "delete_order", "Delete an order.", _schema({"order_id": ID}, ["order_id"]), delete_order, writes=True
    ),
]


def initial_state() -> dict[str, dict[str, Any]]:
    return {
        "users": {"u1": {"name": "Ada", "orders": ["o1", "o2"]}, "u2": {"name": "Bo", "orders": ["o3"]}},
        "orders": {
            "o1": {"user": "u1", "status": "pending", "total": 30},
            "o2": {"user": "u1", "status": "shipped", "total": 12},
            "o3": {"user": "u2", "status": "pending", "total": 7},
        },
    }


def _task(task_id: str, text: str, calls: list[GoldCall], **extra: Any) -> EnvTask:
    complexity = extra.pop("complexity", None) or Complexity.from_calls(calls)
    return EnvTask(
        task_id,
        [{"role": "user", "content": text}],
        Gold(calls, answer=extra.pop("answer", None)),
        complexity,
        **extra,
    )


def tasks(broken: bool = False) -> list[EnvTask]:
    out = [
        _task(
            "look",
            "What is the status of order o2?",
            [GoldCall("get_order", {"order_id": "o2"})],
            answer="shipped",
        ),
        _task(
            "cancel_patched",
            "Cancel my order o9.",
            [GoldCall("cancel_order", {"order_id": "o9"}, compare=["order_id"])],
            tools=["get_order", "cancel_order"],
            state_patch={"orders": {"o9": {"user": "u2", "status": "pending", "total": 99}, "o3": None}},
        ),
        _task(
            "user_then_cancel",
            "I am u1; cancel my pending order.",
            [
                GoldCall("get_user", {"user_id": "u1"}, id="who"),
                GoldCall("cancel_order", {"order_id": "o1"}, id="cancel", depends_on=["who"]),
            ],
        ),
    ]
    if broken:
        out += [
            _task("gold_fails", "Cancel o2.", [GoldCall("cancel_order", {"order_id": "o2"})]),
            _task("missing_tool", "Refund o1.", [GoldCall("refund_order", {"order_id": "o1"})]),
            _task(
                "wrong_level",
                "Look o1 up.",
                [GoldCall("get_order", {"order_id": "o1"})],
                complexity=Complexity(scenario="multi_hop", gold_calls=1, depth=2, width=1, level=3),
            ),
        ]
    return out


def pack(broken: bool = False, pack_id: str = "shop") -> Pack:
    """The shop pack (with three tasks that must fail validation when ``broken``)."""
    info = PackInfo(pack_id, origin="hand", domain="shop", description="A tiny shop for tests.")
    return Pack(info, list(TOOLS), initial_state(), tasks(broken), policy=POLICY)
