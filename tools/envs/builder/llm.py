"""The builder's model: chat completions from an OpenAI-compatible endpoint, JSON answers, retries.

Each stage asks for one JSON object. ``ask`` sends the stage's messages, parses the
answer (code fences and prose around the object are tolerated), validates it against
the stage's JSON schema and then the stage's own ``check`` (which raises ``Rejected``
with a reason), and on a rejection asks again with the reason appended, at most
``attempts`` times. Every answer is logged with its verdict in the stage's ``StageLog``.

How the endpoint is asked for JSON (``ChatModel.json_mode``):

- ``schema``: ``response_format: {"type": "json_schema", ...}`` with the stage's guide schema
  (``schemas``): a server with structured decoding then emits only JSON of that shape, which
  even a 135M model manages (checked with vLLM 0.32 and its xgrammar backend; llama.cpp's and
  OpenAI's servers take the same field);
- ``object``: ``response_format: {"type": "json_object"}`` (any JSON object);
- ``off``: no ``response_format`` (servers that reject it);
- ``auto`` (the default): ``schema``; if the endpoint refuses a schema request (HTTP 400/422)
  and accepts the same request as ``object``, it goes on with ``object`` and says so once.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import jsonschema

__all__ = ["JSON_MODES", "BuildError", "ChatModel", "Rejected", "StageLog", "ask", "parse_json"]

T = TypeVar("T")
_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
_REFUSED_STATUS = {400, 422}  # what an endpoint answers to a response_format it does not take
JSON_MODES = ("auto", "schema", "object", "off")
logger = logging.getLogger(__name__)


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
    # auto | schema | object | off (the module's doc); True and False, the old switch, mean
    # object and off. After a fallback, auto reads object.
    json_mode: str | bool = "auto"
    timeout_s: float = 300.0
    transport_retries: int = 3

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"model endpoint must be an http(s) URL ending in /v1, got {self.base_url!r}")
        if isinstance(self.json_mode, bool):
            self.json_mode = "object" if self.json_mode else "off"
        if self.json_mode not in JSON_MODES:
            raise ValueError(f"json mode must be one of {', '.join(JSON_MODES)}, got {self.json_mode!r}")
        self.base_url = self.base_url.rstrip("/")
        headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._client = httpx.Client(timeout=self.timeout_s, headers=headers)
        self._schemas_taken = False  # the endpoint has answered a schema request

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

    def complete(
        self, messages: list[dict[str, str]], schema: dict[str, Any] | None = None, *, name: str = "answer"
    ) -> str:
        """The assistant's text, asked with ``schema`` as the answer's shape where the JSON mode
        sends one. BuildError when the endpoint stays down, refuses or answers malformed."""
        body: dict[str, Any] = {
            "model": self.model_name(),
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        response_format = self._response_format(schema, name)
        if response_format is not None:
            body["response_format"] = response_format
        response = self._post(body)
        if response_format and response_format["type"] == "json_schema":
            if response.status_code in _REFUSED_STATUS and self.json_mode == "auto":
                refusal = f"{response.status_code}: {response.text[:300]}"
                response = self._post({**body, "response_format": {"type": "json_object"}})
                if response.status_code == 200:
                    self._schema_refused(refusal)
            elif response.status_code in _REFUSED_STATUS:
                raise BuildError(
                    f"{self.base_url} refused the JSON schema of {name} ({response.status_code}: "
                    f"{response.text[:300]}); use --json-mode auto or object for this endpoint"
                )
            elif response.status_code == 200:
                self._schemas_taken = True
        if response.status_code != 200:
            raise BuildError(
                f"{self.base_url}/chat/completions answered {response.status_code}: {response.text[:500]}"
            )
        try:
            return str(response.json()["choices"][0]["message"]["content"] or "")
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise BuildError(
                f"{self.base_url}/chat/completions answered something that is not a chat completion: {exc}"
            ) from None

    def _response_format(self, schema: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
        if self.json_mode in ("auto", "schema") and schema is not None:
            # OpenAI's rule for the name: [a-zA-Z0-9_-], at most 64 characters
            label = re.sub("[^a-zA-Z0-9_-]+", "_", name)[:64] or "answer"
            return {"type": "json_schema", "json_schema": {"name": label, "schema": schema}}
        return None if self.json_mode == "off" else {"type": "json_object"}

    def _schema_refused(self, refusal: str) -> None:
        """auto: a schema request was refused and the same request as json_object answered."""
        if self._schemas_taken:  # the endpoint takes schemas, just not this one: keep asking with them
            logger.warning(
                "the endpoint refused one stage's JSON schema (%s); that answer was asked as json_object",
                refusal,
            )
            return
        self.json_mode = "object"
        logger.warning(
            "the endpoint does not take JSON schemas (%s): asking for json_object from now on; its answers "
            "may then not fit the stages' shapes (--json-mode object to skip the schema request)",
            refusal,
        )

    def _post(self, body: dict[str, Any]) -> httpx.Response:
        """The endpoint's answer to ``body`` after transport retries (any status but the retried ones)."""
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
            return response
        raise BuildError(problem)

    def close(self) -> None:
        self._client.close()


def parse_json(text: str) -> Any:
    """The JSON object in a model's answer (inside ``` fences or prose). Rejected when there is none."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise Rejected(f"the answer contains no JSON object: {text[:120]!r}")
    try:  # strict=False: raw newlines inside strings, as structured decoders write them (schemas.function_guide)
        return json.loads(text[start : end + 1], strict=False)
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
    guide: dict[str, Any] | Callable[[Any], dict[str, Any]] | None = None,
) -> T | None:
    """The first answer that passes the schema and ``check`` (its result), else None after ``attempts``.

    ``guide``: the narrower schema sent for structured decoding (default: ``schema`` itself), or
    a function of the last rejected answer's JSON (None at first) that returns it, so a retry can
    keep what that answer got right."""
    chat = list(messages)
    last: Any = None
    for attempt in range(1, attempts + 1):
        sent = guide(last) if callable(guide) else guide
        text = model.complete(chat, sent or schema, name=label)
        try:
            value = last = parse_json(text)
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
