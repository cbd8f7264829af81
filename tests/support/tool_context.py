"""A ToolContext for calling a tool directly in a test, without a server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol import SessionState


@dataclass
class Ctx:
    """What the executor hands a tool: its session (or None) and the call id."""

    session: SessionState | None
    call_id: str = "call-1"

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        raise NotImplementedError("this context runs one tool on its own")
