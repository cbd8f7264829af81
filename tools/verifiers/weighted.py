"""``weighted``: a weighted sum of other verifiers, e.g. exact match plus a format bonus.

``request.arguments``::

    {"verifiers": {"exact_match": 0.8, "format": 0.2},      # name -> weight
     "arguments": {"format": {"max_calls": 4}},             # per-verifier options
     "normalize": false}                                    # divide by the weight sum

Each named verifier comes from ``BUILTIN_VERIFIERS`` and sees the same trajectory and
ground truth with its own options; ``ctx`` is passed to those that take one (``judge``).
They run concurrently. ``score`` = sum(weight * score) (divided by the sum of the weights
with ``normalize``); ``components`` holds every sub-score under its verifier's name
plus each sub-verifier's own components as ``<name>.<component>``; ``details`` holds
each sub-verifier's details. A sub-verifier that raises scores 0 and its error is
reported in ``details[name]["error"]``: one broken part never loses the whole reward.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from protocol import ToolContext, VerifyRequest, VerifyResult, verifier
from tools.verifiers.table import BUILTIN_VERIFIERS


def _plan(arguments: dict[str, Any], table: dict[str, Callable[..., Any]]) -> dict[str, float]:
    """Validated ``{name: weight}``; ValueError says what is wrong."""
    weights = arguments.get("verifiers")
    if not isinstance(weights, dict) or not weights:
        raise ValueError('weighted needs arguments.verifiers = {"<verifier>": <weight>, ...}')
    plan: dict[str, float] = {}
    for name, weight in weights.items():
        if name == "weighted":
            raise ValueError("weighted cannot contain itself")
        if name not in table:
            raise ValueError(f"unknown verifier {name!r} in weighted; known: {sorted(table)}")
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ValueError(f"weight of {name!r} must be a number, got {weight!r}")
        plan[name] = float(weight)
    per_verifier = arguments.get("arguments", {})
    if not isinstance(per_verifier, dict) or not all(isinstance(v, dict) for v in per_verifier.values()):
        raise ValueError("weighted arguments.arguments must map verifier names to option objects")
    return plan


async def run_verifier(
    fn: Callable[..., Any], request: VerifyRequest, ctx: ToolContext | None
) -> VerifyResult:
    """Call one verifier in-process, sync or async, passing ``ctx`` when it takes one.

    Sync verifiers run in a worker thread so a slow one (SQL) does not block the loop.
    """
    kwargs: dict[str, Any] = {"ctx": ctx} if "ctx" in inspect.signature(fn).parameters else {}
    if inspect.iscoroutinefunction(fn):
        return await fn(request, **kwargs)
    return await asyncio.to_thread(fn, request, **kwargs)


@verifier(name="weighted", timeout_s=180.0)
async def weighted(request: VerifyRequest, ctx: ToolContext | None = None) -> VerifyResult:
    """Weighted combination of other verifiers; see the module docstring for the options."""
    try:
        plan = _plan(request.arguments, BUILTIN_VERIFIERS)
    except ValueError as exc:
        return VerifyResult(0.0, {}, {"error": str(exc)})
    options = request.arguments.get("arguments", {})

    async def one(name: str) -> VerifyResult:
        sub = VerifyRequest(
            verifier=name,
            ground_truth=request.ground_truth,
            response=request.response,
            messages=request.messages,
            session=request.session,
            arguments=options.get(name, {}),
            response_start=request.response_start,
        )
        try:
            return await run_verifier(BUILTIN_VERIFIERS[name], sub, ctx)
        except Exception as exc:  # one broken part must not lose the whole reward
            return VerifyResult(0.0, {}, {"error": f"{type(exc).__name__}: {exc}"})

    results = await asyncio.gather(*(one(name) for name in plan))
    components: dict[str, float] = {}
    details: dict[str, Any] = {}
    total = 0.0
    for (name, weight), result in zip(plan.items(), results, strict=True):
        components[name] = result.score
        for key, value in result.components.items():
            if key != name:
                components[f"{name}.{key}"] = value
        details[name] = result.details
        total += weight * result.score
    if request.arguments.get("normalize"):
        weight_sum = sum(plan.values())
        total = total / weight_sum if weight_sum else 0.0
    details["weights"] = plan
    return VerifyResult(total, components, details)
