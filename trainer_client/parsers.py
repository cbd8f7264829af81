"""Tool-call formats: turn one assistant turn's text into calls, errors and a final answer.

A parser never raises on model output. A malformed call becomes an error message that is
shown to the model as an observation ("what was wrong, what is expected"), so that the
policy can learn the format instead of the rollout crashing. Each parser also names the
stop strings that end a generation turn in its format, so the generator hands control
back as soon as a call is complete.

Model output is only ever parsed as data (``json`` and ``ast.literal_eval``), never run.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_FENCE_RE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```$", re.DOTALL)
_HERMES_EXPECTED = 'expected {"name": ..., "arguments": {...}}'


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


@runtime_checkable
class ToolCallParser(Protocol):
    """A tool-call format. ``stop_strings`` end a generation turn (passed to the generator)."""

    name: str
    stop_strings: tuple[str, ...]

    def parse(self, text: str) -> ParseOutcome: ...


def find_answer(text: str) -> str | None:
    """The content of the first complete ``<answer>...</answer>``, stripped, or None."""
    if "<answer>" not in text:
        return None
    match = ANSWER_RE.search(text)
    return match.group(1).strip() if match else None


def _strip_fences(body: str) -> str:
    body = body.strip()
    if body.startswith("```"):
        match = _FENCE_RE.match(body)
        if match:
            return match.group(1).strip()
    return body


def _json_error(where: str, exc: json.JSONDecodeError, expected: str) -> str:
    return f"invalid JSON in {where}: {exc.msg} at char {exc.pos}; {expected}"


def _loads_tolerant(body: str) -> Any:
    """``json.loads`` that also accepts a Python-style dict with single quotes (cheap case only)."""
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        if "'" in body and '"' not in body:
            return json.loads(body.replace("'", '"'))
        raise


def _call_from_object(obj: Any, where: str, args_keys: tuple[str, ...], expected: str) -> ParsedCall | str:
    """Validate a decoded ``{"name": ..., "arguments": {...}}``; return the call or an error message."""
    if not isinstance(obj, dict):
        return f"{where} must hold a JSON object, got {type(obj).__name__}; {expected}"
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return f'{where} has no tool name: "name" must be a non-empty string; {expected}'
    arguments: Any = {}
    for key in args_keys:
        if key in obj:
            arguments = obj[key]
            break
    if isinstance(arguments, str):  # OpenAI style: arguments as a JSON-encoded string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return _json_error(f'the "{args_keys[0]}" string of {where}', exc, expected)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return f'{where}: "{args_keys[0]}" must be a JSON object, got {type(arguments).__name__}; {expected}'
    return ParsedCall(name.strip(), arguments)


class HermesParser:
    """Qwen/Hermes format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

    Several calls per turn are parsed. By default generation stops at the first
    ``</tool_call>`` (one call per turn), which small models need: they do not end their
    turn after a call and would otherwise invent the tool's response. With
    ``parallel_calls=True`` the turn ends at EOS as with Qwen models, and every call
    written in the turn is returned.
    """

    name = "hermes"
    _OPEN, _CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self, parallel_calls: bool = False) -> None:
        self.parallel_calls = parallel_calls
        self.stop_strings: tuple[str, ...] = (
            ("</answer>",) if parallel_calls else ("</tool_call>", "</answer>")
        )
        self._decoder = json.JSONDecoder()

    def parse(self, text: str) -> ParseOutcome:
        outcome = ParseOutcome(final_answer=find_answer(text))
        pos = text.find(self._OPEN)
        while pos != -1:
            body_start = pos + len(self._OPEN)
            close = text.find(self._CLOSE, body_start)
            if close == -1:
                outcome.errors.append(
                    f"<tool_call> was opened but never closed with </tool_call>; {_HERMES_EXPECTED}"
                )
                break
            end = self._parse_one(text, body_start, close, outcome)
            pos = text.find(self._OPEN, end)
        return outcome

    def _parse_one(self, text: str, body_start: int, close: int, outcome: ParseOutcome) -> int:
        """Parse the call after ``body_start``; return where scanning continues.

        The JSON decoder finds the end of the object itself, so a string argument that
        contains ``</tool_call>`` does not cut the call short.
        """
        start = body_start
        while start < close and text[start].isspace():
            start += 1
        if text.startswith("{", start):
            try:
                obj, end = self._decoder.raw_decode(text, start)
            except json.JSONDecodeError:
                pass
            else:
                after = end
                while after < len(text) and text[after].isspace():
                    after += 1
                if text.startswith(self._CLOSE, after):
                    self._add(obj, outcome)
                    return after + len(self._CLOSE)
        body = _strip_fences(text[body_start:close])
        if not body:
            outcome.errors.append(f"empty <tool_call></tool_call>; {_HERMES_EXPECTED}")
        else:
            try:
                self._add(_loads_tolerant(body), outcome)
            except json.JSONDecodeError as exc:
                outcome.errors.append(_json_error("<tool_call>", exc, _HERMES_EXPECTED))
        return close + len(self._CLOSE)

    @staticmethod
    def _add(obj: Any, outcome: ParseOutcome) -> None:
        call = _call_from_object(obj, "<tool_call>", ("arguments", "parameters"), _HERMES_EXPECTED)
        if isinstance(call, str):
            outcome.errors.append(call)
        else:
            outcome.calls.append(call)


class SearchR1Parser:
    """Search-R1 tags: ``<search>query</search>`` is a call of the search tool, ``<answer>`` ends.

    Generation stops at ``</search>`` or ``</answer>``; the retrieved passages come back as
    ``<information>...</information>`` (see the text observation template).
    """

    name = "search_r1"
    _SEARCH_RE = re.compile(r"<search>(.*?)</search>", re.DOTALL)

    def __init__(self, tool_name: str = "search", argument: str = "query") -> None:
        self.tool_name = tool_name
        self.argument = argument
        self.stop_strings: tuple[str, ...] = ("</search>", "</answer>")

    def parse(self, text: str) -> ParseOutcome:
        outcome = ParseOutcome(final_answer=find_answer(text))
        if "<search>" not in text:
            return outcome
        end = 0
        for match in self._SEARCH_RE.finditer(text):
            end = match.end()
            query = match.group(1).strip()
            if query:
                outcome.calls.append(ParsedCall(self.tool_name, {self.argument: query}))
            else:
                outcome.errors.append("empty <search></search>: write the search query between the tags")
        if "<search>" in text[end:]:
            outcome.errors.append("<search> was opened but never closed with </search>")
        return outcome


class Llama3JsonParser:
    """Llama 3.x JSON tool calls: a bare ``{"name": ..., "parameters": {...}}`` (several
    separated by ``;``), optionally after ``<|python_tag|>``.

    Only a turn whose text starts with ``{`` (after the tag) is read as calls, as in
    Llama 3's own convention; the turn ends at EOS (``<|eot_id|>``/``<|eom_id|>``).
    """

    name = "llama3_json"
    _EXPECTED = 'expected {"name": ..., "parameters": {...}}'

    def __init__(self) -> None:
        self.stop_strings: tuple[str, ...] = ("</answer>",)
        self._decoder = json.JSONDecoder()

    def parse(self, text: str) -> ParseOutcome:
        outcome = ParseOutcome(final_answer=find_answer(text))
        body = text.strip()
        if body.startswith("<|python_tag|>"):
            body = body[len("<|python_tag|>") :].lstrip()
        body = _strip_fences(body)
        pos = 0
        while pos < len(body) and body[pos] == "{":
            try:
                obj, end = self._decoder.raw_decode(body, pos)
            except json.JSONDecodeError as exc:
                outcome.errors.append(_json_error("the tool call", exc, self._EXPECTED))
                break
            call = _call_from_object(obj, "the tool call", ("parameters", "arguments"), self._EXPECTED)
            if isinstance(call, str):
                outcome.errors.append(call)
            else:
                outcome.calls.append(call)
            pos = end
            while pos < len(body) and body[pos] in " \t\r\n;":
                pos += 1
        return outcome


class PythonicParser:
    """Pythonic calls (Llama 3.2/4 style): ``[get_weather(city="Paris"), add(a=1, b=2)]``.

    Parsed with ``ast`` and ``ast.literal_eval`` on each argument: literals only, nothing
    is evaluated. Only a turn whose text is a bracketed list holding at least one call is
    read as calls.
    """

    name = "pythonic"
    _EXPECTED = 'expected [tool_name(arg="value", ...)] with literal arguments'

    def __init__(self) -> None:
        self.stop_strings: tuple[str, ...] = ("</answer>",)

    def parse(self, text: str) -> ParseOutcome:
        outcome = ParseOutcome(final_answer=find_answer(text))
        body = text.strip()
        if body.startswith("<|python_start|>"):
            body = body[len("<|python_start|>") :].removesuffix("<|python_end|>").strip()
        body = _strip_fences(body)
        if not (body.startswith("[") and body.endswith("]")):
            return outcome
        try:
            tree = ast.parse(body, mode="eval")
        except SyntaxError as exc:
            outcome.errors.append(f"invalid call list: {exc.msg} at char {exc.offset}; {self._EXPECTED}")
            return outcome
        if not isinstance(tree.body, ast.List) or not any(isinstance(n, ast.Call) for n in tree.body.elts):
            return outcome  # a plain list such as [1, 2, 3] is an ordinary reply, not calls
        for node in tree.body.elts:
            result = self._call(node)
            if isinstance(result, str):
                outcome.errors.append(result)
            else:
                outcome.calls.append(result)
        return outcome

    def _call(self, node: ast.expr) -> ParsedCall | str:
        if not isinstance(node, ast.Call):
            return f"list item {ast.unparse(node)!r} is not a call; {self._EXPECTED}"
        name = _dotted_name(node.func)
        if name is None:
            return f"{ast.unparse(node.func)!r} is not a tool name; {self._EXPECTED}"
        if node.args:
            return f"{name}(...) uses positional arguments; pass every argument by keyword; {self._EXPECTED}"
        arguments: dict[str, Any] = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                return f"{name}(...) uses **kwargs; {self._EXPECTED}"
            try:
                arguments[keyword.arg] = ast.literal_eval(keyword.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return f"{name}(...): argument {keyword.arg} is not a literal value; {self._EXPECTED}"
        return ParsedCall(name, arguments)


def _dotted_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted_name(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


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
