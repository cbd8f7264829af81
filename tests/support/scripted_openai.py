"""A scripted OpenAI-compatible chat endpoint on loopback: canned answers per builder stage.

A real Starlette app under uvicorn (``serve_in_thread``), so the builder's HTTP client,
JSON handling and retries run exactly as against vLLM. Each request is routed by the
``[builder stage: <key>]`` line its system prompt starts with; the script gives each key
a list of answers, handed out in order (a dict is sent as its JSON text, a string as is,
an int is an HTTP error with that status).
A key with no answer left gets HTTP 400 naming it, so a test whose script is short fails
with that message. Every request body is kept in ``requests`` for assertions.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

__all__ = ["ScriptedChat"]

_STAGE = re.compile(r"^\[builder stage: ([^\]]+)\]")


class ScriptedChat:
    """The script and the requests seen; ``app`` is the ASGI app to serve."""

    def __init__(self, script: Mapping[str, Sequence[str | int | dict[str, Any]]]) -> None:
        self.script = {key: list(answers) for key, answers in script.items()}
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self.app = Starlette(routes=[Route("/v1/chat/completions", self._complete, methods=["POST"])])

    def stages(self) -> list[str]:
        """The stage key of every request, in order."""
        return [key for key, _ in self.requests]

    def left(self) -> dict[str, int]:
        """Answers not handed out yet, per key (a test can assert its whole script was used)."""
        return {key: len(answers) for key, answers in self.script.items() if answers}

    async def _complete(self, request: Request) -> Response:
        body = await request.json()
        messages = body.get("messages") or []
        system = messages[0].get("content", "") if messages and messages[0].get("role") == "system" else ""
        match = _STAGE.match(system)
        if match is None:
            return _error(400, "the first message is no builder stage prompt")
        key = match.group(1)
        with self._lock:
            self.requests.append((key, body))
            answers = self.script.get(key) or []
            if not answers:
                return _error(400, f"the script has no answer left for stage {key!r}")
            answer = answers.pop(0)
        if isinstance(answer, int):  # an HTTP failure of the endpoint, not an answer
            return _error(answer, f"scripted failure {answer}")
        text = answer if isinstance(answer, str) else json.dumps(answer)
        return JSONResponse(
            {
                "id": "chatcmpl-" + uuid.uuid4().hex[:12],
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "scripted"),
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            }
        )


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=status)
