"""What a tool-call parser returns (``ParsedCall``, ``ParseOutcome``) and what it is (``ToolCallParser``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["ParseOutcome", "ParsedCall", "ToolCallParser", "Tools"]

Tools = Sequence[Mapping[str, Any]]


@dataclass(slots=True, frozen=True)
class ParsedCall:
    """One tool call as the model wrote it: a tool name and a JSON-object of arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass(slots=True)
class ParseOutcome:
    """What one assistant turn asked for.

    ``errors`` are messages addressed to the model; ``final_answer`` (if not None) ends
    the trajectory.
    """

    calls: list[ParsedCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    final_answer: str | None = None

    def add(self, call: ParsedCall | str) -> None:
        """Record a parsed call, or an error message in its place."""
        if isinstance(call, str):
            self.errors.append(call)
        else:
            self.calls.append(call)


@runtime_checkable
class ToolCallParser(Protocol):
    """A tool-call format. ``stop_strings`` end a generation turn (passed to the generator).

    The built-in parsers also take ``parse(text, tools=schemas)``: with the task's tool
    schemas, pythonic positional arguments map to the schema's parameter order.
    """

    name: str
    stop_strings: tuple[str, ...]

    def parse(self, text: str) -> ParseOutcome: ...
