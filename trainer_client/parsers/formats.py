"""The JSON and tag formats: hermes/Qwen ``<tool_call>``, Search-R1 ``<search>``, Llama 3 JSON.

A parser never raises on model output, whatever the string, and reads it in linear time.
A malformed call becomes an error message shown to the model ("what was wrong, what is
expected"), and the well-formed calls beside it are kept.
"""

from __future__ import annotations

import json
import re
from typing import Any

from trainer_client.parsers.decode import decode_json, loads_json, loads_tolerant, strip_fences
from trainer_client.parsers.tags import TagScanner, find_answer
from trainer_client.parsers.types import ParsedCall, ParseOutcome, Tools
from trainer_client.parsers.values import check_call

__all__ = ["HermesParser", "Llama3JsonParser", "SearchR1Parser"]

_HERMES_EXPECTED = 'expected {"name": ..., "arguments": {...}}'
_SPACES = re.compile(r"\s*")


def _json_error(where: str, exc: json.JSONDecodeError, expected: str) -> str:
    return f"invalid JSON in {where}: {exc.msg} at char {exc.pos}; {expected}"


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
            arguments = loads_json(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return _json_error(f'the "{args_keys[0]}" string of {where}', exc, expected)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return f'{where}: "{args_keys[0]}" must be a JSON object, got {type(arguments).__name__}; {expected}'
    return check_call(ParsedCall(name.strip(), arguments))


class HermesParser:
    """Qwen/Hermes format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

    Several calls per turn are parsed. By default generation stops at the first
    ``</tool_call>`` (one call per turn), which small models need: they do not end their
    turn after a call and would otherwise invent the tool's response. With
    ``parallel_calls=True`` the turn ends at EOS as with Qwen models, and every call
    written in the turn is returned. A body that is not JSON is read as a Python dict
    literal (single quotes, ``True``/``None``), which small models often write.

    A ``<tool_call>`` opened again before the previous one was closed, one never closed,
    and a ``</tool_call>`` that closes none are each an error; the calls around them parse.
    """

    name = "hermes"
    _OPEN, _CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self, parallel_calls: bool = False) -> None:
        self.parallel_calls = parallel_calls
        self.stop_strings: tuple[str, ...] = (
            ("</answer>",) if parallel_calls else ("</tool_call>", "</answer>")
        )

    def parse(self, text: str, tools: Tools | None = None) -> ParseOutcome:
        outcome = ParseOutcome(final_answer=find_answer(text))
        tags = TagScanner(text, self._OPEN, self._CLOSE)
        pos = 0
        while (tag := tags.next_tag(pos)) is not None:
            kind, at = tag
            if kind == "close":
                outcome.errors.append(
                    f"</tool_call> closes no <tool_call>: open each call with <tool_call>; {_HERMES_EXPECTED}"
                )
                pos = at + len(self._CLOSE)
            else:
                pos = self._parse_one(tags, at + len(self._OPEN), outcome)
        return outcome

    def _parse_one(self, tags: TagScanner, body_start: int, outcome: ParseOutcome) -> int:
        """Parse the call after ``body_start``; return where scanning continues.

        The JSON decoder finds the end of the object itself, so a string argument that
        contains ``</tool_call>`` or ``<tool_call>`` does not cut the call short.
        """
        text = tags.text
        start = _SPACES.match(text, body_start).end()
        if text.startswith("{", start):
            try:
                obj, end = decode_json(text, start)
            except json.JSONDecodeError:
                pass
            else:
                after = _SPACES.match(text, end).end()
                if text.startswith(self._CLOSE, after):
                    outcome.add(self._call(obj))
                    return after + len(self._CLOSE)
        how, end = tags.body_end(body_start)
        if how == "reopened":
            outcome.errors.append(
                f"<tool_call> was opened again before </tool_call> closed the call before it; {_HERMES_EXPECTED}"
            )
            return end
        if how == "unclosed":
            outcome.errors.append(
                f"<tool_call> was opened but never closed with </tool_call>; {_HERMES_EXPECTED}"
            )
            return end
        body = strip_fences(text[body_start:end])
        if not body:
            outcome.errors.append(f"empty <tool_call></tool_call>; {_HERMES_EXPECTED}")
        else:
            try:
                outcome.add(self._call(loads_tolerant(body)))
            except json.JSONDecodeError as exc:
                outcome.errors.append(_json_error("<tool_call>", exc, _HERMES_EXPECTED))
        return end + len(self._CLOSE)

    @staticmethod
    def _call(obj: Any) -> ParsedCall | str:
        return _call_from_object(obj, "<tool_call>", ("arguments", "parameters"), _HERMES_EXPECTED)


class SearchR1Parser:
    """Search-R1 tags: ``<search>query</search>`` is a call of the search tool, ``<answer>`` ends.

    Generation stops at ``</search>`` or ``</answer>``; the retrieved passages come back as
    ``<information>...</information>`` (see the text observation template). Tags opened
    again, never closed or closed without an opener are errors, as in hermes.
    """

    name = "search_r1"
    _OPEN, _CLOSE = "<search>", "</search>"

    def __init__(self, tool_name: str = "search", argument: str = "query") -> None:
        self.tool_name = tool_name
        self.argument = argument
        self.stop_strings: tuple[str, ...] = ("</search>", "</answer>")

    def parse(self, text: str, tools: Tools | None = None) -> ParseOutcome:
        outcome = ParseOutcome(final_answer=find_answer(text))
        tags = TagScanner(text, self._OPEN, self._CLOSE)
        pos = 0
        while (tag := tags.next_tag(pos)) is not None:
            kind, at = tag
            if kind == "close":
                outcome.errors.append("</search> closes no <search>: write <search>query</search>")
                pos = at + len(self._CLOSE)
                continue
            body_start = at + len(self._OPEN)
            how, end = tags.body_end(body_start)
            if how == "reopened":
                outcome.errors.append("<search> was opened again before </search> closed the query before it")
                pos = end
            elif how == "unclosed":
                outcome.errors.append("<search> was opened but never closed with </search>")
                break
            else:
                self._add_query(text[body_start:end], outcome)
                pos = end + len(self._CLOSE)
        return outcome

    def _add_query(self, body: str, outcome: ParseOutcome) -> None:
        query = body.strip()
        if query:
            outcome.add(check_call(ParsedCall(self.tool_name, {self.argument: query})))
        else:
            outcome.errors.append("empty <search></search>: write the search query between the tags")


class Llama3JsonParser:
    """Llama 3.x JSON tool calls: a bare ``{"name": ..., "parameters": {...}}`` (several
    separated by ``;``), or a JSON array of them, optionally after ``<|python_tag|>``.

    Only a turn whose text starts with ``{`` or ``[`` (after the tag) is read as calls, as
    in Llama 3's own convention; an array is a call list when it holds an object (``[1, 2]``
    is an ordinary reply), and each item that is not a call is an error. The turn ends at
    EOS (``<|eot_id|>``/``<|eom_id|>``).
    """

    name = "llama3_json"
    _EXPECTED = 'expected {"name": ..., "parameters": {...}}'

    def __init__(self) -> None:
        self.stop_strings: tuple[str, ...] = ("</answer>",)

    def parse(self, text: str, tools: Tools | None = None) -> ParseOutcome:
        outcome = ParseOutcome(final_answer=find_answer(text))
        body = text.strip()
        if body.startswith("<|python_tag|>"):
            body = body[len("<|python_tag|>") :].lstrip()
        body = strip_fences(body)
        if body.startswith("["):
            self._parse_array(body, outcome)
            return outcome
        pos = 0
        while pos < len(body) and body[pos] == "{":
            try:
                obj, end = decode_json(body, pos)
            except json.JSONDecodeError as exc:
                outcome.errors.append(_json_error("the tool call", exc, self._EXPECTED))
                break
            outcome.add(self._call(obj))
            pos = end
            while pos < len(body) and body[pos] in " \t\r\n;":
                pos += 1
        return outcome

    def _parse_array(self, body: str, outcome: ParseOutcome) -> None:
        try:
            items, _ = decode_json(body)
        except json.JSONDecodeError as exc:
            if body[1:].lstrip().startswith("{"):  # "[{..." is a call list, cut or broken
                outcome.errors.append(_json_error("the list of tool calls", exc, self._EXPECTED))
            return
        if not any(isinstance(item, dict) for item in items):
            return  # "[1, 2, 3]" is an ordinary reply, not calls
        for item in items:
            outcome.add(self._call(item))

    def _call(self, obj: Any) -> ParsedCall | str:
        return _call_from_object(obj, "the tool call", ("parameters", "arguments"), self._EXPECTED)
