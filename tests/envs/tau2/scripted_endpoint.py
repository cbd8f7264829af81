"""A scripted OpenAI-compatible chat endpoint on loopback that can answer with tool calls.

A real Starlette app under a real uvicorn (``serve_in_thread``): the server's ``llm`` tool
talks to it exactly as to vLLM. ``script`` hands out answers in order: a string is the
message's content, a ``Tools`` the message's tool calls (OpenAI form, arguments as JSON text),
an int an HTTP error with that status; none left is HTTP 400. Every request body is kept.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

__all__ = ["ScriptedEndpoint", "Tools"]


@dataclass
class Tools:
    """An answer made of tool calls: ``(name, arguments)`` pairs, with optional text."""

    calls: list[tuple[str, dict[str, Any]]]
    text: str | None = None


class ScriptedEndpoint:
    def __init__(self) -> None:
        self.answers: list[str | Tools | int] = []
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.app = Starlette(routes=[Route("/v1/chat/completions", self._complete, methods=["POST"])])

    def script(self, *answers: str | Tools | int) -> None:
        with self._lock:
            self.answers, self.requests = list(answers), []

    async def _complete(self, request: Request) -> Response:
        body = await request.json()
        with self._lock:
            self.requests.append(body)
            answer: str | Tools | int = self.answers.pop(0) if self.answers else 400
        if isinstance(answer, int):
            return JSONResponse({"error": {"message": f"scripted failure {answer}"}}, status_code=answer)
        if isinstance(answer, Tools):
            calls = [
                {
                    "id": "call_" + uuid.uuid4().hex[:8],
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
                for name, arguments in answer.calls
            ]
            message: dict[str, Any] = {"role": "assistant", "content": answer.text, "tool_calls": calls}
            finish = "tool_calls"
        else:
            message, finish = {"role": "assistant", "content": answer}, "stop"
        return JSONResponse(
            {
                "id": "chatcmpl-" + uuid.uuid4().hex[:12],
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            }
        )
