"""The builder's model: chat completions from an OpenAI-compatible endpoint, JSON answers, retries.

Each stage asks for one JSON object. ``ask`` sends the stage's messages, parses the
answer (code fences and prose around the object are tolerated), validates it against
the stage's JSON schema and then the stage's own ``check`` (which raises ``Rejected``
with a reason), and on a rejection asks again with the reason appended, at most
``attempts`` times. Every answer is logged with its verdict in the stage's ``StageLog``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import jsonschema

__all__ = ["BuildError", "ChatModel", "Rejected", "StageLog", "ask", "parse_json"]

T = TypeVar("T")
_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class Rejected(ValueError):
    """A candidate failed a check; the message is the reason (shown to the model on retry)."""


class BuildError(RuntimeError):
    """The build cannot go on (endpoint unreachable, a stage produced nothing acceptable)."""


@dataclass
class StageLog:
    """Candidates of one stage: how many, how many accepted, and why the others were rejected."""

    candidates: int = 0
    accepted: int = 0
    rejected: list[dict[str, str]] = field(default_factory=list)
    resumed: bool = False

    def accept(self, n: int = 1) -> None:
        self.candidates += n
        self.accepted += n

    def reject(self, candidate: str, reason: str) -> None:
        self.candidates += 1
        self.rejected.append({"candidate": candidate, "reason": reason[:500]})

    def merge(self, other: StageLog) -> None:
        self.candidates += other.candidates
        self.accepted += other.accepted
        self.rejected.extend(other.rejected)

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidates": self.candidates,
            "accepted": self.accepted,
            "rejected": len(self.rejected),
            "reasons": self.rejected,
            "resumed": self.resumed,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StageLog:
        return cls(data["candidates"], data["accepted"], list(data["reasons"]), resumed=True)


@dataclass
class ChatModel:
    """``POST {base_url}/chat/completions`` with a bounded number of transport retries."""

    base_url: str
    model: str | None = None  # None: the first model the endpoint lists at /models (vLLM serves one)
    api_key: str | None = None
    temperature: float = 0.2
    max_tokens: int = 4096
    json_mode: bool = True  # response_format json_object (vLLM, OpenAI); off for servers without it
    timeout_s: float = 300.0
    transport_retries: int = 3

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"model endpoint must be an http(s) URL ending in /v1, got {self.base_url!r}")
        self.base_url = self.base_url.rstrip("/")
        headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._client = httpx.Client(timeout=self.timeout_s, headers=headers)

    def model_name(self) -> str:
        """The model to ask: the configured one, else the endpoint's first listed model, else "default"."""
        if self.model is None:
            self.model = "default"
            try:
                listed = self._client.get(f"{self.base_url}/models")
                if listed.status_code == 200:
                    self.model = str(listed.json()["data"][0]["id"])
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
                pass  # the request itself will say what is wrong with the endpoint
        return self.model

    def complete(self, messages: list[dict[str, str]]) -> str:
        """The assistant's text. BuildError when the endpoint stays down or answers malformed."""
        body: dict[str, Any] = {
            "model": self.model_name(),
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        if self.json_mode:
            body["response_format"] = {"type": "json_object"}
        url = f"{self.base_url}/chat/completions"
        problem = ""
        for attempt in range(self.transport_retries + 1):
            if attempt:
                time.sleep(min(8.0, 0.5 * 2**attempt))
            try:
                response = self._client.post(url, json=body)
            except httpx.HTTPError as exc:
                problem = f"cannot reach {url}: {exc}"
                continue
            if response.status_code in _RETRY_STATUS:
                problem = f"{url} answered {response.status_code}: {response.text[:300]}"
                continue
            if response.status_code != 200:
                raise BuildError(f"{url} answered {response.status_code}: {response.text[:500]}")
            try:
                return str(response.json()["choices"][0]["message"]["content"] or "")
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                raise BuildError(f"{url} answered something that is not a chat completion: {exc}") from None
        raise BuildError(problem)

    def close(self) -> None:
        self._client.close()


def parse_json(text: str) -> Any:
    """The JSON object in a model's answer (inside ``` fences or prose). Rejected when there is none."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise Rejected(f"the answer contains no JSON object: {text[:120]!r}")
    try:
        return json.loads(text[start : end + 1])
    except json.JSONDecodeError as exc:
        raise Rejected(f"the answer is not valid JSON ({exc.msg} at char {exc.pos})") from None


def schema_problem(value: Any, schema: dict[str, Any]) -> str | None:
    """The first schema violation, said with its path, or None."""
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
    return f"{where}: {error.message[:300]}"


def ask(
    model: ChatModel,
    messages: list[dict[str, str]],
    schema: dict[str, Any],
    check: Callable[[Any], T],
    log: StageLog,
    *,
    label: str,
    attempts: int,
) -> T | None:
    """The first answer that passes the schema and ``check`` (its result), else None after ``attempts``."""
    chat = list(messages)
    for attempt in range(1, attempts + 1):
        text = model.complete(chat)
        try:
            value = parse_json(text)
            problem = schema_problem(value, schema)
            if problem:
                raise Rejected(f"does not match the output schema: {problem}")
            result = check(value)
        except Rejected as exc:
            log.reject(f"{label} (attempt {attempt})", str(exc))
            chat = [
                *messages,
                {"role": "assistant", "content": text[:4000]},
                {
                    "role": "user",
                    "content": f"That answer was rejected: {exc}. Answer again with corrected JSON only.",
                },
            ]
            continue
        log.accept()
        return result
    return None
