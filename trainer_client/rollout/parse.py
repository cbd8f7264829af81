"""Parsing a model turn: the configured parser, given the task's tools, every call checked.

``turn_parser(parser)`` is what ``RolloutCore`` calls on each turn's text: malformed calls,
and calls whose arguments cannot travel as JSON, come back as parse errors, never raised.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from trainer_client.parsers.registry import ParseOutcome, ToolCallParser, check_call

__all__ = ["turn_parser"]


def turn_parser(parser: ToolCallParser) -> Callable[[str, Any], ParseOutcome]:
    """``parse(text, tools)``: ``parser``'s outcome for a turn, its calls checked."""
    parse = _parse_function(parser)
    return lambda text, tools: _checked(parse(text, tools))


def _parse_function(parser: ToolCallParser) -> Callable[[str, Any], ParseOutcome]:
    """``parser.parse`` with the task's tool schemas where it takes them (custom parsers
    may implement ``parse(text)`` only)."""
    parse: Callable[..., ParseOutcome] = parser.parse
    try:
        parameters = inspect.signature(parse).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return lambda text, tools: parse(text)
    if any(p.name == "tools" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return lambda text, tools: parse(text, tools=tools)
    return lambda text, tools: parse(text)


def _checked(outcome: ParseOutcome) -> ParseOutcome:
    """The outcome with every call checked to encode as JSON (a custom parser's too): a
    call that cannot is that call's parse error, and never reaches a batch of calls."""
    checked = ParseOutcome(errors=list(outcome.errors), final_answer=outcome.final_answer)
    for call in outcome.calls:
        checked.add(check_call(call))
    return checked
