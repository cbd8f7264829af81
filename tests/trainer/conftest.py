"""Fixtures for the rollout-core tests: the real SmolLM2 tokenizer and an in-process invoker."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

import pytest

import protocol


class InProcessInvoker:
    """A ``ToolInvoker`` that runs plain Python functions in the test process.

    Unknown tools and exceptions become error results, as on the tool server, unless
    ``raise_on`` names the tool: then ``call_tools`` itself raises (a transport failure).
    It records every call and every released session.
    """

    def __init__(
        self,
        tools: dict[str, Callable[..., Any]],
        *,
        raise_on: str | None = None,
        delay_s: float = 0.0,
    ) -> None:
        self.tools = tools
        self.raise_on = raise_on
        self.delay_s = delay_s
        self.calls: list[protocol.Call] = []
        self.batches: list[list[protocol.Call]] = []
        self.released: list[str] = []

    async def call_tools(self, calls: list[protocol.Call]) -> list[protocol.Result]:
        self.calls.extend(calls)
        self.batches.append(list(calls))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        results = []
        for call in calls:
            if call.name == self.raise_on:
                raise ConnectionError(f"tool server unreachable while calling {call.name}")
            fn = self.tools.get(call.name)
            if fn is None:
                results.append(
                    protocol.Result.failure(call.call_id, protocol.ErrorKind.UNKNOWN_TOOL, call.name)
                )
                continue
            try:
                value = fn(**call.arguments)
                if inspect.isawaitable(value):
                    value = await value
            except Exception as exc:
                results.append(protocol.Result.failure(call.call_id, protocol.ErrorKind.TOOL_ERROR, str(exc)))
                continue
            results.append(protocol.Result(call.call_id, content=[{"type": "text", "text": str(value)}]))
        return results

    async def release_session(self, session_id: str) -> None:
        self.released.append(session_id)


@pytest.fixture(scope="session")
def smol_tokenizer() -> Any:
    from trainer_client.backends.models import load_tokenizer

    return load_tokenizer("smollm2")
