"""Tool-call formats: turn one assistant turn's text into calls, errors and a final answer.

A parser never raises on model output, whatever the string. A malformed call becomes an
error message that is shown to the model as an observation ("what was wrong, what is
expected"), so that the policy can learn the format instead of the rollout crashing. Each
parser also names the stop strings that end a generation turn in its format, so the
generator hands control back as soon as a call is complete.

Model output is only ever parsed as data (``json`` and ``ast.literal_eval``), never run.
Both decoders recurse, so nesting is bounded before they run (``MAX_NESTING``), and a
call's arguments must be able to travel as JSON (``check_call``): a set, bytes, NaN or a
lone surrogate is that call's parse error, never a failure of the batch it would join.
"""

from __future__ import annotations

import ast
import json
import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_FENCE_RE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```$", re.DOTALL)
_HERMES_EXPECTED = 'expected {"name": ..., "arguments": {...}}'

# Deepest nesting of brackets (or AST nodes) the parsers decode; real calls stay far below
# it, and it keeps json's and ast's recursion well inside Python's stack limit.
MAX_NESTING = 100
# JSON integers the tool server can decode (orjson: signed or unsigned 64-bit).
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
_CLIP = 80

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


def find_answer(text: str) -> str | None:
    """The content of the first complete ``<answer>...</answer>``, stripped, or None."""
    if "<answer>" not in text:
        return None
    match = ANSWER_RE.search(text)
    return match.group(1).strip() if match else None


# --------------------------------------------------------------------------- JSON-able calls


class _NotJson(ValueError):
    """A value that cannot be sent to the tool server as JSON: where it is, and why."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def _printable(text: str) -> str:
    """``text`` safe to show the model: lone surrogates escaped, long text clipped."""
    safe = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return safe if len(safe) <= _CLIP else safe[: _CLIP - 3] + "..."


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_value(value: Any, path: str, depth: int) -> Any:
    """``value`` as plain JSON data (tuples become lists), or ``_NotJson``."""
    if depth > MAX_NESTING:
        raise _NotJson(path, f"nested deeper than {MAX_NESTING} levels")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise _NotJson(path, "the integer does not fit in 64 bits")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _NotJson(path, f"{value} is not a JSON number")
        return value
    if isinstance(value, str):
        if not _is_utf8(value):
            raise _NotJson(path, "the string holds a lone surrogate (not valid UTF-8)")
        return value
    if isinstance(value, list | tuple):
        return [_json_value(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _json_value(v, f"{path}[{k!r}]", depth + 1) for k, v in _json_items(value, path)}
    raise _NotJson(path, _not_json_reason(value))


def _json_items(value: dict[Any, Any], path: str) -> list[tuple[str, Any]]:
    for key in value:
        if not isinstance(key, str):
            raise _NotJson(path, f"object keys must be strings, got {type(key).__name__}")
        if not _is_utf8(key):
            raise _NotJson(path, "an object key holds a lone surrogate (not valid UTF-8)")
    return list(value.items())


def _not_json_reason(value: Any) -> str:
    if isinstance(value, set | frozenset):
        return "a set is not JSON; use a list"
    if isinstance(value, bytes | bytearray):
        return "bytes are not JSON; use a string"
    if value is Ellipsis:
        return "... is not a JSON value"
    return f"a {type(value).__name__} is not a JSON value"


def check_call(call: ParsedCall) -> ParsedCall | str:
    """The call with plain-JSON arguments, or an error message for the model.

    Everything that reaches the tool server must encode as JSON; checking each call on
    its own keeps one bad call from failing the others it would be batched with.
    """
    name = call.name
    if not isinstance(name, str) or not name.strip():
        return "the tool name must be a non-empty string"
    if not _is_utf8(name):
        return f"the tool name '{_printable(name)}' holds a lone surrogate (not valid UTF-8)"
    if not isinstance(call.arguments, dict):
        return f"{_printable(name)}: the arguments must be an object, got {type(call.arguments).__name__}"
    arguments: dict[str, Any] = {}
    try:
        for key, value in _json_items(call.arguments, "arguments"):
            arguments[key] = _json_value(value, key, 1)
    except _NotJson as exc:
        return f"{_printable(name)}: argument {_printable(exc.path)} cannot be sent as JSON: {exc.reason}"
    return ParsedCall(name, arguments)


# --------------------------------------------------------------------------- bounded decoding


def _json_too_deep(text: str, start: int) -> bool:
    """Whether the JSON value at ``start`` nests deeper than ``MAX_NESTING``.

    Linear and exact for JSON (strings are double-quoted with backslash escapes); it
    stops where the value closes, so scanning one call does not scan the rest of the turn.
    """
    if text.count("[", start) + text.count("{", start) <= MAX_NESTING:
        return False
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_NESTING:
                return True
        elif ch in "]}":
            depth -= 1
            if depth <= 0:
                return False
    return False


def _decode_json(decoder: json.JSONDecoder, text: str, start: int = 0) -> tuple[Any, int]:
    """``raw_decode`` behind the nesting guard; every failure is a ``JSONDecodeError``."""
    if _json_too_deep(text, start):
        raise json.JSONDecodeError(f"nesting deeper than {MAX_NESTING} levels", text, start)
    try:
        return decoder.raw_decode(text, start)
    except json.JSONDecodeError:
        raise
    except (ValueError, RecursionError) as exc:  # e.g. an integer with more than 4300 digits
        raise json.JSONDecodeError(str(exc).split(";")[0], text, start) from None


_DECODER = json.JSONDecoder()


def _loads_json(text: str) -> Any:
    """``json.loads`` behind the nesting guard."""
    start = len(text) - len(text.lstrip())
    value, end = _decode_json(_DECODER, text, start)
    if text[end:].strip():
        raise json.JSONDecodeError("Extra data", text, end)
    return value


def _ast_too_deep(tree: ast.AST) -> bool:
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            return True
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return False


def _parse_python(source: str) -> ast.expr:
    """One Python expression as an AST of bounded depth; ``SyntaxError`` otherwise.

    ``ast.parse`` itself fails on deep input with RecursionError or MemoryError (its
    parser stack); both, like a too deep tree, become a SyntaxError here.
    """
    if not _is_utf8(source):
        raise SyntaxError("the text holds a lone surrogate (not valid UTF-8)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. invalid escape sequences in strings
            tree = ast.parse(source, mode="eval")
    except SyntaxError:
        raise
    except (MemoryError, RecursionError):
        raise SyntaxError("nested too deeply to parse") from None
    except ValueError as exc:
        raise SyntaxError(str(exc)) from None
    if _ast_too_deep(tree):
        raise SyntaxError(f"nesting deeper than {MAX_NESTING} levels")
    return tree.body


def _literal(node: ast.expr) -> Any:
    """``ast.literal_eval`` of a bounded-depth node; ValueError when not a literal."""
    try:
        return ast.literal_eval(node)
    except (TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise ValueError(str(exc)) from None


def _loads_tolerant(body: str) -> Any:
    """JSON, else a Python literal (single quotes, ``True``/``None``); raises the JSON error."""
    try:
        return _loads_json(body)
    except json.JSONDecodeError as json_error:
        try:
            return _literal(_parse_python(body))
        except (SyntaxError, ValueError):
            raise json_error from None


# --------------------------------------------------------------------------- shared helpers


def _strip_fences(body: str) -> str:
    body = body.strip()
    if body.startswith("```"):
        match = _FENCE_RE.match(body)
        if match:
            return match.group(1).strip()
    return body


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
            arguments = _loads_json(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return _json_error(f'the "{args_keys[0]}" string of {where}', exc, expected)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return f'{where}: "{args_keys[0]}" must be a JSON object, got {type(arguments).__name__}; {expected}'
    return check_call(ParsedCall(name.strip(), arguments))


def tool_parameters(tools: Tools | None) -> dict[str, list[str]]:
    """Parameter names per tool, in schema order, from OpenAI-style or MCP tool schemas."""
    order: dict[str, list[str]] = {}
    for tool in tools or ():
        if not isinstance(tool, Mapping):
            continue
        spec = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
        schema = spec.get("parameters") or spec.get("inputSchema") or {}
        properties = schema.get("properties") if isinstance(schema, Mapping) else None
        if isinstance(spec.get("name"), str) and isinstance(properties, Mapping):
            order[spec["name"]] = [str(p) for p in properties]
    return order


# --------------------------------------------------------------------------- formats


class HermesParser:
    """Qwen/Hermes format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

    Several calls per turn are parsed. By default generation stops at the first
    ``</tool_call>`` (one call per turn), which small models need: they do not end their
    turn after a call and would otherwise invent the tool's response. With
    ``parallel_calls=True`` the turn ends at EOS as with Qwen models, and every call
    written in the turn is returned. A body that is not JSON is read as a Python dict
    literal (single quotes, ``True``/``None``), which small models often write.
    """

    name = "hermes"
    _OPEN, _CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self, parallel_calls: bool = False) -> None:
        self.parallel_calls = parallel_calls
        self.stop_strings: tuple[str, ...] = (
            ("</answer>",) if parallel_calls else ("</tool_call>", "</answer>")
        )
        self._decoder = json.JSONDecoder()

    def parse(self, text: str, tools: Tools | None = None) -> ParseOutcome:
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
                obj, end = _decode_json(self._decoder, text, start)
            except json.JSONDecodeError:
                pass
            else:
                after = end
                while after < len(text) and text[after].isspace():
                    after += 1
                if text.startswith(self._CLOSE, after):
                    outcome.add(self._call(obj))
                    return after + len(self._CLOSE)
        body = _strip_fences(text[body_start:close])
        if not body:
            outcome.errors.append(f"empty <tool_call></tool_call>; {_HERMES_EXPECTED}")
        else:
            try:
                outcome.add(self._call(_loads_tolerant(body)))
            except json.JSONDecodeError as exc:
                outcome.errors.append(_json_error("<tool_call>", exc, _HERMES_EXPECTED))
        return close + len(self._CLOSE)

    @staticmethod
    def _call(obj: Any) -> ParsedCall | str:
        return _call_from_object(obj, "<tool_call>", ("arguments", "parameters"), _HERMES_EXPECTED)


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

    def parse(self, text: str, tools: Tools | None = None) -> ParseOutcome:
        outcome = ParseOutcome(final_answer=find_answer(text))
        if "<search>" not in text:
            return outcome
        end = 0
        for match in self._SEARCH_RE.finditer(text):
            end = match.end()
            query = match.group(1).strip()
            if query:
                outcome.add(check_call(ParsedCall(self.tool_name, {self.argument: query})))
            else:
                outcome.errors.append("empty <search></search>: write the search query between the tags")
        if "<search>" in text[end:]:
            outcome.errors.append("<search> was opened but never closed with </search>")
        return outcome


class Llama3JsonParser:
    """Llama 3.x JSON tool calls: a bare ``{"name": ..., "parameters": {...}}`` (several
    separated by ``;``), or a JSON array of them, optionally after ``<|python_tag|>``.

    Only a turn whose text starts with ``{`` or ``[{`` (after the tag) is read as calls,
    as in Llama 3's own convention; the turn ends at EOS (``<|eot_id|>``/``<|eom_id|>``).
    """

    name = "llama3_json"
    _EXPECTED = 'expected {"name": ..., "parameters": {...}}'
    _ARRAY_RE = re.compile(r"\[\s*\{")

    def __init__(self) -> None:
        self.stop_strings: tuple[str, ...] = ("</answer>",)
        self._decoder = json.JSONDecoder()

    def parse(self, text: str, tools: Tools | None = None) -> ParseOutcome:
        outcome = ParseOutcome(final_answer=find_answer(text))
        body = text.strip()
        if body.startswith("<|python_tag|>"):
            body = body[len("<|python_tag|>") :].lstrip()
        body = _strip_fences(body)
        if self._ARRAY_RE.match(body):
            self._parse_array(body, outcome)
            return outcome
        pos = 0
        while pos < len(body) and body[pos] == "{":
            try:
                obj, end = _decode_json(self._decoder, body, pos)
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
            items, _ = _decode_json(self._decoder, body)
        except json.JSONDecodeError as exc:
            outcome.errors.append(_json_error("the list of tool calls", exc, self._EXPECTED))
            return
        for item in items:
            outcome.add(self._call(item))

    def _call(self, obj: Any) -> ParsedCall | str:
        return _call_from_object(obj, "the tool call", ("parameters", "arguments"), self._EXPECTED)


class PythonicParser:
    """Pythonic calls (Llama 3.2/4 style): ``[get_weather(city="Paris"), add(a=1, b=2)]``.

    Parsed with ``ast`` and ``ast.literal_eval`` on each argument: literals only, nothing
    is evaluated. A turn whose text starts with ``[name(`` is a call list; it must end
    with the closing ``]`` (an unclosed list is reported, as an unclosed ``<tool_call>``
    is in hermes). A plain list such as ``[1, 2]`` is an ordinary reply. Positional
    arguments are bound to the parameters in schema order when ``parse`` gets the tool
    schemas, and are an error otherwise.
    """

    name = "pythonic"
    _EXPECTED = 'expected [tool_name(arg="value", ...)] with literal arguments'
    _CALL_LIST_RE = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")

    def __init__(self) -> None:
        self.stop_strings: tuple[str, ...] = ("</answer>",)

    def parse(self, text: str, tools: Tools | None = None) -> ParseOutcome:
        outcome = ParseOutcome(final_answer=find_answer(text))
        body = text.strip()
        if body.startswith("<|python_start|>"):
            body = body[len("<|python_start|>") :].removesuffix("<|python_end|>").strip()
        body = _strip_fences(body)
        if not body.startswith("["):
            return outcome
        looks_like_calls = self._CALL_LIST_RE.match(body) is not None
        try:
            tree: ast.expr | None = _parse_python(body)
            problem = "the text after [ is not a list of calls"
        except SyntaxError as exc:
            tree = None
            problem = exc.msg + (f" at char {exc.offset}" if exc.offset is not None else "")
        if looks_like_calls and not isinstance(tree, ast.List):
            outcome.errors.append(self._list_error(body, problem))
            return outcome
        if not isinstance(tree, ast.List) or not any(isinstance(n, ast.Call) for n in tree.elts):
            return outcome  # "[1, 2, 3]" or "[see above]" is an ordinary reply, not calls
        parameters = tool_parameters(tools)
        for node in tree.elts:
            outcome.add(self._call(node, parameters))
        return outcome

    def _list_error(self, body: str, problem: str) -> str:
        if not body.endswith("]"):
            return (
                "the call list was opened with [ but not closed with ] at the end of the turn; "
                f"{self._EXPECTED}"
            )
        return f"invalid call list: {problem}; {self._EXPECTED}"

    def _call(self, node: ast.expr, parameters: dict[str, list[str]]) -> ParsedCall | str:
        if not isinstance(node, ast.Call):
            return f"list item {_printable(ast.unparse(node))!r} is not a call; {self._EXPECTED}"
        name = _dotted_name(node.func)
        if name is None:
            return f"{_printable(ast.unparse(node.func))!r} is not a tool name; {self._EXPECTED}"
        arguments: dict[str, Any] = {}
        if node.args:
            bound = self._bind_positional(name, node.args, parameters.get(name))
            if isinstance(bound, str):
                return bound
            arguments.update(bound)
        for keyword in node.keywords:
            if keyword.arg is None:
                return f"{name}(...) uses **kwargs; {self._EXPECTED}"
            if keyword.arg in arguments:
                return f"{name}(...) gives argument {keyword.arg} twice; {self._EXPECTED}"
            try:
                arguments[keyword.arg] = _literal(keyword.value)
            except ValueError:
                return f"{name}(...): argument {keyword.arg} is not a literal value; {self._EXPECTED}"
        return check_call(ParsedCall(name, arguments))

    def _bind_positional(
        self, name: str, args: list[ast.expr], order: list[str] | None
    ) -> dict[str, Any] | str:
        """Positional arguments by the schema's parameter order (BFCL writes ``cd('dir')``)."""
        if order is None:
            return f"{name}(...) uses positional arguments; pass every argument by keyword; {self._EXPECTED}"
        if any(isinstance(a, ast.Starred) for a in args):
            return f"{name}(...) uses *args; {self._EXPECTED}"
        if len(args) > len(order):
            return (
                f"{name}(...) takes at most {len(order)} positional arguments "
                f"({', '.join(order) or 'none'}), got {len(args)}; {self._EXPECTED}"
            )
        bound: dict[str, Any] = {}
        for parameter, node in zip(order, args, strict=False):
            try:
                bound[parameter] = _literal(node)
            except ValueError:
                return f"{name}(...): argument {parameter} is not a literal value; {self._EXPECTED}"
        return bound


def _dotted_name(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of attributes on a name (the AST depth is already bounded)."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


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
