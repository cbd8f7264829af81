"""The ``llm`` model tool: a chat completion from any OpenAI-compatible endpoint.

vLLM, SGLang, llama.cpp's server, Ollama and hosted APIs all speak
``POST {base_url}/chat/completions``, so one small client covers them. It pools
connections, bounds concurrency, and retries what is worth retrying (429, 5xx,
connection failures) with exponential backoff. A dead endpoint becomes an
``unavailable`` error that names the URL, so an agent tool or a trainer can tell
"the model is down" from "the model said something wrong".

Configuration (constructor kwargs from the YAML config, else the environment):
``TOOLFACTORY_LLM_BASE_URL``, ``TOOLFACTORY_LLM_MODEL``, ``TOOLFACTORY_LLM_API_KEY``
(or the variable named by ``api_key_env``, default ``OPENAI_API_KEY``).
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Annotated, Any

import httpx

from protocol import ErrorKind, ToolError, ToolOutput, tool

ENV_BASE_URL = "TOOLFACTORY_LLM_BASE_URL"
ENV_MODEL = "TOOLFACTORY_LLM_MODEL"
ENV_API_KEY = "TOOLFACTORY_LLM_API_KEY"
_ROLES = {"system", "user", "assistant", "tool", "developer"}
_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
_MAX_RETRY_AFTER_S = 30.0


def _positive(name: str, value: float) -> float:
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """Validate chat messages; the error names the first bad message and what is wrong."""
    if not isinstance(messages, list) or not messages:
        raise ToolError(
            "'messages' must be a non-empty list of {role, content} objects", ErrorKind.INVALID_ARGUMENTS
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ToolError(
                f"messages[{i}] must be an object, got {type(message).__name__}", "invalid_arguments"
            )
        role = message.get("role")
        if role not in _ROLES:
            raise ToolError(
                f"messages[{i}].role must be one of {sorted(_ROLES)}, got {role!r}", "invalid_arguments"
            )
        content = message.get("content")
        if not isinstance(content, str | list) and not (content is None and role == "assistant"):
            raise ToolError(
                f"messages[{i}].content must be a string (or a list of content parts)", "invalid_arguments"
            )
    return messages


@tool(name="llm", kind="model", timeout_s=180.0, idempotent=True)
class LlmTool:
    """Ask a language model. Give `prompt` (one user message) or `messages` (a chat); returns its reply."""

    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 60.0,
        max_retries: int = 2,
        backoff_s: float = 0.5,
        max_concurrency: int = 8,
        max_tokens: int = 512,
        temperature: float = 0.0,
        system_prompt: str | None = None,
        extra_body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Configure the endpoint.

        Args:
            base_url: e.g. ``http://127.0.0.1:8000/v1`` (the part before ``/chat/completions``).
            model: model name sent in the request; if unset, the first of ``GET /models``.
            api_key: bearer token; else ``$TOOLFACTORY_LLM_API_KEY`` or ``$<api_key_env>``.
            timeout_s: per-attempt HTTP timeout.
            max_retries: extra attempts after a 429/5xx/connection failure.
            backoff_s: first retry delay; doubles per attempt (plus jitter; Retry-After wins).
            max_concurrency: requests in flight at once (and the connection pool size).
            max_tokens, temperature: defaults when a call does not give them.
            system_prompt: prepended as a system message when the call has none.
            extra_body: merged into every request (e.g. ``{"chat_template_kwargs": {...}}``).
            headers: extra HTTP headers.
        """
        url = base_url or os.environ.get(ENV_BASE_URL)
        self.base_url = url.rstrip("/") if url else None
        self.model = model or os.environ.get(ENV_MODEL)
        self.api_key = api_key or os.environ.get(ENV_API_KEY) or os.environ.get(api_key_env)
        self.timeout_s = _positive("timeout_s", float(timeout_s))
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_concurrency = int(_positive("max_concurrency", max_concurrency))
        self.max_tokens = int(_positive("max_tokens", max_tokens))
        self.temperature = float(temperature)
        self.system_prompt = system_prompt
        self.extra_body = dict(extra_body or {})
        self.headers = dict(headers or {})
        self._client: httpx.AsyncClient | None = None
        self._slots: asyncio.Semaphore | None = None

    @property
    def configured(self) -> bool:
        return self.base_url is not None

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    async def startup(self) -> None:
        """Open the pooled HTTP client (the server calls this once, before serving)."""
        if self._client is None:
            headers = {"content-type": "application/json", **self.headers}
            if self.api_key:
                headers["authorization"] = f"Bearer {self.api_key}"
            limits = httpx.Limits(
                max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency
            )
            self._client = httpx.AsyncClient(
                headers=headers,
                timeout=httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 10.0)),
                limits=limits,
            )
            self._slots = asyncio.Semaphore(self.max_concurrency)

    async def shutdown(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def __call__(
        self,
        messages: Annotated[
            list[dict[str, Any]] | None, "Chat messages [{role, content}, ...] (use this or `prompt`)."
        ] = None,
        prompt: Annotated[str | None, "A single user message (use this or `messages`)."] = None,
        max_tokens: Annotated[int | None, "Most tokens to generate (default: the tool's setting)."] = None,
        temperature: Annotated[float | None, "Sampling temperature; 0 is greedy."] = None,
        stop: Annotated[list[str] | None, "Stop generating at any of these strings."] = None,
        tools: Annotated[
            list[dict[str, Any]] | None,
            "OpenAI tool schemas the model may call ([{type: function, function: {name, "
            "description, parameters}}]); its calls come back in the structured output's tool_calls.",
        ] = None,
    ) -> ToolOutput:
        """Ask a language model and return its reply as text (and its tool calls, if any)."""
        chat = self._build_messages(prompt, messages)
        if max_tokens is not None and max_tokens <= 0:
            raise ToolError(f"max_tokens must be > 0, got {max_tokens}", ErrorKind.INVALID_ARGUMENTS)
        if not self.configured:
            raise ToolError(
                "the llm tool has no endpoint: set 'base_url' in its config or the "
                f"{ENV_BASE_URL} environment variable",
                ErrorKind.UNAVAILABLE,
            )
        await self.startup()
        body: dict[str, Any] = {
            **self.extra_body,
            "model": self.model or await self._default_model(),
            "messages": chat,
            "max_tokens": max_tokens if max_tokens is not None else self.max_tokens,
            "temperature": temperature if temperature is not None else self.temperature,
        }
        if stop:
            body["stop"] = stop
        if tools:
            body["tools"] = tools
        data = await self._post(body)
        return self._to_output(data)

    # ------------------------------------------------------------------ helpers

    def _build_messages(
        self, prompt: str | None, messages: list[dict[str, Any]] | None
    ) -> list[dict[str, Any]]:
        if (prompt is None) == (messages is None):
            raise ToolError(
                "give exactly one of 'prompt' (a string) or 'messages' (a list)", "invalid_arguments"
            )
        chat = [{"role": "user", "content": prompt}] if prompt is not None else check_messages(messages)
        if self.system_prompt and chat[0].get("role") != "system":
            chat = [{"role": "system", "content": self.system_prompt}, *chat]
        return chat

    async def _default_model(self) -> str:
        """Ask the endpoint which model it serves (vLLM and friends serve exactly one)."""
        assert self._client is not None
        try:
            response = await self._client.get(f"{self.base_url}/models")
            response.raise_for_status()
            models = response.json().get("data") or []
            self.model = str(models[0]["id"])
        except (httpx.HTTPError, ValueError, LookupError, KeyError, TypeError) as exc:
            raise ToolError(
                f"no 'model' configured and {self.base_url}/models did not name one ({exc}); set 'model'",
                ErrorKind.UNAVAILABLE,
            ) from None
        return self.model

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        assert self._client is not None and self._slots is not None
        attempts = self.max_retries + 1
        last = ""
        async with self._slots:
            for attempt in range(attempts):
                delay = self.backoff_s * (2**attempt) * (1 + 0.25 * random.random())  # noqa: S311
                try:
                    response = await self._client.post(self.url, json=body)
                except httpx.TimeoutException:
                    last = f"no answer within {self.timeout_s:g} s"
                except httpx.TransportError as exc:
                    last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                else:
                    if response.status_code < 400:
                        try:
                            return response.json()
                        except ValueError:
                            raise ToolError(
                                f"LLM endpoint {self.url} answered with a body that is not JSON", "tool_error"
                            ) from None
                    last = f"HTTP {response.status_code}: {_error_text(response)}"
                    if response.status_code in (401, 403):
                        raise ToolError(
                            f"LLM endpoint {self.url} rejected the credentials ({last}); check api_key",
                            ErrorKind.UNAVAILABLE,
                        )
                    if response.status_code not in _RETRY_STATUS:
                        raise ToolError(f"LLM endpoint {self.url} refused the request ({last})", "tool_error")
                    delay = max(delay, _retry_after(response))
                if attempt + 1 < attempts:
                    await asyncio.sleep(delay)
        raise ToolError(
            f"LLM endpoint {self.url} is unavailable after {attempts} attempt(s): {last}",
            ErrorKind.UNAVAILABLE,
        )

    @staticmethod
    def _to_output(data: dict[str, Any]) -> ToolOutput:
        try:
            choice = data["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise ToolError(f"LLM response has no choices: {str(data)[:300]}", "tool_error") from None
        message = choice.get("message") or {}
        content = message.get("content") or choice.get("text") or ""
        structured = {
            "content": content,
            "model": data.get("model"),
            "usage": data.get("usage") or {},
            "finish_reason": choice.get("finish_reason"),
        }
        if message.get("tool_calls"):  # OpenAI form: [{id, type, function: {name, arguments (JSON text)}}]
            structured["tool_calls"] = message["tool_calls"]
        return ToolOutput.text(content, structured)


def _error_text(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
        if message:
            return str(message)[:300]
    except (ValueError, AttributeError):
        pass
    return response.text[:300] or response.reason_phrase


def _retry_after(response: httpx.Response) -> float:
    value = response.headers.get("retry-after")
    if not value:
        return 0.0
    try:
        return min(max(float(value), 0.0), _MAX_RETRY_AFTER_S)
    except ValueError:
        return 0.0
