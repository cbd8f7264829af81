"""veRL custom reward function that scores through the tool server's ``/v1/verify``.

For users who keep veRL's reward path (their own agent loop, or the toolfactory loop
with ``compute_reward: false``). veRL config::

    reward:
      custom_reward_function:
        path: <site-packages>/trainer_client/reward_bridge.py   # or the file of this module
        name: compute_score
        reward_kwargs:
          server_urls: [http://tools:8000]
          verifier: exact_match
          verifier_arguments: {require_answer_tag: true}

veRL awaits ``compute_score(data_source, solution_str, ground_truth, extra_info, **reward_kwargs)``
(it is an ``async def``) in its reward-loop workers. ``extra_info["verifier"]`` and
``extra_info["verifier_arguments"]`` override the configured ones per sample. The result
is ``{"score": float, "verify_ok": 0.0 | 1.0}``: veRL takes ``score`` as the reward and
logs the rest; a verification that fails (server down, verifier error) scores
``score_on_error`` (default 0.0) instead of failing the training step.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import protocol
from trainer_client.client.tool_client import ToolClient
from trainer_client.shared import URL_ENV, LoopClients, plain

logger = logging.getLogger(__name__)

_CLIENTS = LoopClients()  # per (event loop, URLs, timeout): concurrent scorings batch into few POSTs


def _urls(server_urls: str | Sequence[str] | None) -> tuple[str, ...]:
    if server_urls is None:
        server_urls = os.environ.get(URL_ENV, "")
    if isinstance(server_urls, str):
        server_urls = [u for u in server_urls.split(",") if u]
    urls = tuple(plain(list(server_urls)))
    if not urls:
        raise ValueError(
            "compute_score needs the tool server URL: set reward_kwargs.server_urls in the veRL config "
            f"or the {URL_ENV} environment variable"
        )
    return urls


async def aclose_clients() -> None:
    """Close the clients of the running event loop (veRL's workers simply exit instead)."""
    await _CLIENTS.aclose()


async def verify_one(
    solution_str: str,
    ground_truth: Any,
    *,
    server_urls: str | Sequence[str] | None = None,
    verifier: str = "exact_match",
    verifier_arguments: Mapping[str, Any] | None = None,
    timeout_s: float = 60.0,
) -> protocol.VerifyResult:
    """Score one response with a server verifier (raises nothing for a failed verifier: see ``error``)."""
    request = protocol.VerifyRequest(
        verifier=verifier,
        ground_truth=plain(ground_truth),
        response=solution_str,
        arguments=plain(dict(verifier_arguments or {})),
    )
    urls = _urls(server_urls)
    client = _CLIENTS.get((urls, timeout_s), lambda: ToolClient(list(urls), timeout_s=timeout_s))
    (result,) = await client.verify([request])
    return result


async def compute_score(
    data_source: str | None,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    server_urls: str | Sequence[str] | None = None,
    verifier: str = "exact_match",
    verifier_arguments: Mapping[str, Any] | None = None,
    score_on_error: float = 0.0,
    timeout_s: float = 60.0,
    **_ignored: Any,
) -> dict[str, float]:
    """veRL's reward-function signature; returns ``{"score", "verify_ok"}``.

    ``data_source`` is not used for routing (the verifier is configured, or named per
    sample in ``extra_info``); extra keyword arguments veRL adds are ignored.
    """
    extra = plain(dict(extra_info or {}))
    name = extra.get("verifier") or verifier
    arguments = extra.get("verifier_arguments") or verifier_arguments
    try:
        result = await verify_one(
            solution_str,
            ground_truth,
            server_urls=server_urls,
            verifier=name,
            verifier_arguments=arguments,
            timeout_s=timeout_s,
        )
    except ValueError:
        raise  # a configuration error: say so instead of training on zeros
    except Exception as exc:
        logger.warning("verification via %s failed: %s", name, exc)
        return {"score": float(score_on_error), "verify_ok": 0.0}
    if result.is_error:
        message = result.error.message if result.error else "unknown error"
        logger.warning("verifier %s failed for %s: %s", name, data_source, message)
        return {"score": float(score_on_error), "verify_ok": 0.0}
    return {"score": float(result.score), "verify_ok": 1.0}
