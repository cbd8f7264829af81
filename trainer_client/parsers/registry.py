"""Tool-call formats: turn one assistant turn's text into calls, errors and a final answer.

A parser never raises on model output, whatever the string, and reads it in time linear
in its length. A malformed call becomes an error message that is shown to the model as
an observation ("what was wrong, what is expected"), so that the policy can learn the
format instead of the rollout crashing, and the well-formed calls beside it are kept.
Each parser also names the stop strings that end a generation turn in its format, so the
generator hands control back as soon as a call is complete.

The formats live in ``formats`` (hermes, search_r1, llama3_json) and
``pythonic``; decoding model text as data in ``decode``; tag scanning in
``tags``; the check that a call can travel as JSON in ``values``. This
module is the registry (``get_parser``) and the public names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer_client.parsers.formats import HermesParser, Llama3JsonParser, SearchR1Parser
from trainer_client.parsers.pythonic import PythonicParser, tool_parameters
from trainer_client.parsers.tags import find_answer
from trainer_client.parsers.types import ParsedCall, ParseOutcome, ToolCallParser, Tools
from trainer_client.parsers.values import MAX_NESTING, check_call

__all__ = [
    "MAX_NESTING",
    "HermesParser",
    "Llama3JsonParser",
    "ParseOutcome",
    "ParsedCall",
    "PythonicParser",
    "SearchR1Parser",
    "ToolCallParser",
    "Tools",
    "check_call",
    "find_answer",
    "get_parser",
    "parser_names",
    "register_parser",
    "tool_parameters",
]

_PARSERS: dict[str, Callable[..., ToolCallParser]] = {
    "hermes": HermesParser,
    "qwen": HermesParser,
    "search_r1": SearchR1Parser,
    "llama3_json": Llama3JsonParser,
    "pythonic": PythonicParser,
}


def register_parser(name: str, factory: Callable[..., ToolCallParser]) -> None:
    """Make a custom format available to ``get_parser`` (and so to ``RolloutConfig.format``)."""
    _PARSERS[name] = factory


def parser_names() -> list[str]:
    return sorted(_PARSERS)


def get_parser(name: str, **options: Any) -> ToolCallParser:
    """The parser for a format name; ``options`` go to its constructor (e.g. ``parallel_calls``)."""
    try:
        factory = _PARSERS[name]
    except KeyError:
        raise ValueError(
            f"unknown tool-call format {name!r}; known formats: {', '.join(parser_names())}"
        ) from None
    try:
        return factory(**options)
    except TypeError as exc:
        raise ValueError(f"bad options for tool-call format {name!r}: {exc}") from None
