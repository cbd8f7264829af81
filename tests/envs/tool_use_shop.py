"""A small shop world's tools (products, users, orders) for the ``tool_use`` reward's tests and bench.

Four tools over three tables: two reads, two writes; ``place_order`` fails when stock
runs out (a failing call), ``set_tags`` takes an array declared ``uniqueItems`` (a set,
so its order does not matter to the matching), ``place_order.note`` has a default.
"""

from __future__ import annotations

from typing import Any

from protocol import ToolError
from tools.envs.pack import EnvTool
from tools.envs.world import World

__all__ = ["TOOLS"]


def get_product(world: World, product_id: str) -> dict[str, Any]:
    product = world["products"].peek(product_id)
    if product is None:
        raise ToolError(f"no product {product_id}")
    return {"product_id": product_id, **product}


def get_user(world: World, user_id: str) -> dict[str, Any]:
    user = world["users"].peek(user_id)
    if user is None:
        raise ToolError(f"no user {user_id}")
    return {"user_id": user_id, **user}


def place_order(world: World, user_id: str, product_id: str, quantity: int, note: str = "") -> dict[str, Any]:
    product = world["products"][product_id]
    if product["stock"] < quantity:
        raise ToolError(f"only {product['stock']} of {product_id} left")
    product["stock"] -= quantity
    order_id = f"o{len(world['orders']) + 1}"
    world["orders"][order_id] = {"user_id": user_id, "product_id": product_id, "quantity": quantity}
    return {"order_id": order_id, "total": product["price"] * quantity}


def set_tags(world: World, user_id: str, tags: list[str]) -> str:
    world["users"][user_id]["tags"] = sorted(tags)
    return "ok"


TOOLS = [
    EnvTool(
        "get_product",
        "Look up a product.",
        {
            "type": "object",
            "properties": {"product_id": {"type": "string"}},
            "required": ["product_id"],
            "additionalProperties": False,
        },
        get_product,
    ),
    EnvTool(
        "get_user",
        "Look up a user.",
        {
            "type": "object",
            "properties": {"user_id": {"type": "string"}},
            "required": ["user_id"],
            "additionalProperties": False,
        },
        get_user,
    ),
    EnvTool(
        "place_order",
        "Order a product for a user.",
        {
            "type": "object",
            "properties": {
                "user_id": {"type": "string"},
                "product_id": {"type": "string"},
                "quantity": {"type": "integer", "minimum": 1},
                "note": {"type": "string", "default": ""},
            },
            "required": ["user_id", "product_id", "quantity"],
            "additionalProperties": False,
        },
        place_order,
        writes=True,
    ),
    EnvTool(
        "set_tags",
        "Replace a user's tags.",
        {
            "type": "object",
            "properties": {
                "user_id": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            },
            "required": ["user_id", "tags"],
            "additionalProperties": False,
        },
        set_tags,
        writes=True,
    ),
]
