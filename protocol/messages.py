"""Calls, results and verification records, and their orjson encoding.

Records are plain dataclasses that orjson serialises natively (no ``to_dict`` round
trip). Not slotted on purpose: orjson reads a dataclass's ``__dict__`` in one pass but
a slotted one field by field, which made encoding a result several times slower and
a visible share of the batched path's server time (bench/README.md).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from protocol.errors import ErrorKind, ProtocolError

MAX_ID_LENGTH = 256


def new_call_id() -> str:
    """A fresh, globally unique call id (the idempotency key of one call).

    128 random bits from the OS, like a uuid4 but drawn 1,024 ids at a time: a uuid4 each
    was a visible share of a trainer client's CPU per call. A forked child draws its own.
    """
    try:
        return _call_ids.pop()
    except IndexError:
        _draw_call_ids()
        return _call_ids.pop()


_CALL_IDS_PER_DRAW = 1024
_call_ids: list[str] = []


def _draw_call_ids() -> None:
    global _call_ids
    digits = os.urandom(16 * _CALL_IDS_PER_DRAW).hex()
    _call_ids = [digits[i : i + 32] for i in range(0, len(digits), 32)]


def _forget_call_ids() -> None:
    """In a forked child: the parent's undrawn ids are the parent's to use."""
    _call_ids.clear()


os.register_at_fork(after_in_child=_forget_call_ids)


def new_session_id() -> str:
    """A fresh session id; one per trajectory."""
    return "s-" + uuid.uuid4().hex


# A call made by a task's simulated user (τ²'s requestor "user": the customer acting on their
# own phone), not by the policy model. The role travels in the call id because the model
# chooses only a call's name and arguments, never its id: so the model cannot pass itself off
# as the user, and an environment refuses the model's calls to the user's tools.
USER_CALL_PREFIX = "user-"


def new_user_call_id() -> str:
    """A fresh call id that marks the call as the simulated user's (``is_user_call``)."""
    return USER_CALL_PREFIX + uuid.uuid4().hex


def is_user_call(call_id: str) -> bool:
    """Whether the call was made by a simulated user (its id from ``new_user_call_id``)."""
    return call_id.startswith(USER_CALL_PREFIX)


@dataclass
class Call:
    """One tool invocation. ``call_id`` is chosen by the client and is the idempotency key."""

    call_id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    session: str | None = None


@dataclass
class ErrorInfo:
    kind: ErrorKind
    message: str


@dataclass
class Result:
    """The outcome of one call: MCP content blocks, optional structured output, or an error."""

    call_id: str
    content: list[dict[str, Any]] = field(default_factory=list)
    structured: Any = None
    is_error: bool = False
    error: ErrorInfo | None = None
    elapsed_ms: float = 0.0
    cached: bool = False

    @classmethod
    def failure(cls, call_id: str, kind: ErrorKind, message: str, elapsed_ms: float = 0.0) -> Result:
        return cls(
            call_id=call_id,
            content=[{"type": "text", "text": f"Error ({kind.value}): {message}"}],
            is_error=True,
            error=ErrorInfo(kind, message),
            elapsed_ms=elapsed_ms,
        )

    @property
    def text(self) -> str:
        """All text blocks joined: what a model sees as the observation."""
        return "\n".join(b.get("text", "") for b in self.content if b.get("type") == "text")


@dataclass
class VerifyRequest:
    """Score one trajectory. ``response`` is the final model text; ``messages`` the chat, if any.

    ``response_start`` is the index in ``messages`` of the first message of the rollout:
    the ones before it are the prompt (system text, worked examples, the question), which
    verifiers that judge what the *model* wrote (tool-call counts, answers) must not read.
    """

    verifier: str
    ground_truth: Any = None
    response: str | None = None
    messages: list[dict[str, Any]] | None = None
    session: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)  # verifier options (weights, rubric)
    request_id: str | None = None
    response_start: int = 0

    def prompt_messages(self) -> list[dict[str, Any]]:
        """The messages before the rollout: system text, worked examples, the question."""
        return (self.messages or [])[: self.response_start]

    def response_messages(self) -> list[dict[str, Any]]:
        """The messages of the rollout itself: the model's turns and the tool results."""
        return (self.messages or [])[self.response_start :]


@dataclass
class VerifyResult:
    score: float
    components: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    request_id: str | None = None
    is_error: bool = False
    error: ErrorInfo | None = None


def encode(obj: Any) -> bytes:
    """Serialise records, lists and dicts of them to JSON bytes."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


def _load(body: bytes | str) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"body is not valid JSON: {exc}") from None


def _list_field(data: Any, key: str) -> list[Any]:
    if not isinstance(data, dict):
        raise ProtocolError(f'body must be a JSON object with a "{key}" list, got {type(data).__name__}')
    items = data.get(key)
    if not isinstance(items, list):
        raise ProtocolError(f'"{key}" must be a list, got {type(items).__name__}')
    return items


def _id(value: Any, where: str, *, required: bool) -> str | None:
    if value is None:
        if required:
            raise ProtocolError(f"{where} is missing")
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH:
        raise ProtocolError(f"{where} must be a non-empty string of at most {MAX_ID_LENGTH} characters")
    return value


def call_from_dict(item: Any, index: int = 0) -> Call:
    # Fast path for a well-formed call (the batched hot path): plain type checks, no
    # error text built. Anything else goes through the checks that say what is wrong.
    if type(item) is dict:
        call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
        session = item.get("session")
        if (
            type(call_id) is str
            and 0 < len(call_id) <= MAX_ID_LENGTH
            and type(name) is str
            and name
            and type(arguments) is dict
            and (session is None or (type(session) is str and 0 < len(session) <= MAX_ID_LENGTH))
        ):
            return Call(call_id, name, arguments, session)
    return _checked_call_from_dict(item, index)


def _checked_call_from_dict(item: Any, index: int) -> Call:
    where = f"calls[{index}]"
    if not isinstance(item, dict):
        raise ProtocolError(f"{where} must be an object, got {type(item).__name__}")
    call_id = _id(item.get("call_id"), f"{where}.call_id", required=True)
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"{where}.name must be a non-empty string")
    arguments = item.get("arguments")
    if arguments is None:
        arguments = {}
    elif not isinstance(arguments, dict):
        raise ProtocolError(f"{where}.arguments must be an object, got {type(arguments).__name__}")
    session = _id(item.get("session"), f"{where}.session", required=False)
    return Call(call_id, name, arguments, session)  # type: ignore[arg-type]


def decode_calls(body: bytes | str) -> list[Call]:
    """Parse ``{"calls": [...]}``; raises ProtocolError naming the first bad field."""
    return [call_from_dict(item, i) for i, item in enumerate(_list_field(_load(body), "calls"))]


def _error_from(value: Any) -> ErrorInfo | None:
    if not value:
        return None
    try:
        kind = ErrorKind(value.get("kind"))
    except ValueError:
        kind = ErrorKind.TOOL_ERROR
    return ErrorInfo(kind, str(value.get("message", "")))


def result_from_dict(item: dict[str, Any]) -> Result:
    return Result(
        call_id=item["call_id"],
        content=item.get("content") or [],
        structured=item.get("structured"),
        is_error=bool(item.get("is_error")),
        error=_error_from(item.get("error")),
        elapsed_ms=float(item.get("elapsed_ms") or 0.0),
        cached=bool(item.get("cached")),
    )


def decode_results(body: bytes | str) -> list[Result]:
    return [result_from_dict(item) for item in _list_field(_load(body), "results")]


def verify_request_from_dict(item: Any, index: int = 0, where: str | None = None) -> VerifyRequest:
    """One verify request, checked field by field; errors name ``where`` (default ``requests[i]``)."""
    where = where or f"requests[{index}]"
    if not isinstance(item, dict):
        raise ProtocolError(f"{where} must be an object, got {type(item).__name__}")
    name = item.get("verifier")
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"{where}.verifier must be a non-empty string")
    response = item.get("response")
    if response is not None and not isinstance(response, str):
        raise ProtocolError(f"{where}.response must be a string")
    messages = item.get("messages")
    if messages is not None and not (
        isinstance(messages, list) and all(isinstance(m, dict) for m in messages)
    ):
        raise ProtocolError(f"{where}.messages must be a list of message objects")
    if response is None and messages is None:
        raise ProtocolError(f'{where} needs "response" (final text) or "messages"')
    arguments = item.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise ProtocolError(f"{where}.arguments must be an object")
    response_start = item.get("response_start")
    response_start = 0 if response_start is None else response_start
    if isinstance(response_start, bool) or not isinstance(response_start, int) or response_start < 0:
        raise ProtocolError(f"{where}.response_start must be a non-negative integer")
    if response_start > len(messages or ()):
        raise ProtocolError(
            f"{where}.response_start ({response_start}) is past the end of messages ({len(messages or ())})"
        )
    return VerifyRequest(
        verifier=name,
        ground_truth=item.get("ground_truth"),
        response=response,
        messages=messages,
        session=_id(item.get("session"), f"{where}.session", required=False),
        arguments=arguments,
        request_id=_id(item.get("request_id"), f"{where}.request_id", required=False),
        response_start=response_start,
    )


def decode_verify_requests(body: bytes | str) -> list[VerifyRequest]:
    items = _list_field(_load(body), "requests")
    return [verify_request_from_dict(item, i) for i, item in enumerate(items)]


def verify_result_from_dict(item: dict[str, Any]) -> VerifyResult:
    return VerifyResult(
        score=float(item.get("score") or 0.0),
        components={k: float(v) for k, v in (item.get("components") or {}).items()},
        details=item.get("details") or {},
        request_id=item.get("request_id"),
        is_error=bool(item.get("is_error")),
        error=_error_from(item.get("error")),
    )


def decode_verify_results(body: bytes | str) -> list[VerifyResult]:
    return [verify_result_from_dict(item) for item in _list_field(_load(body), "results")]
