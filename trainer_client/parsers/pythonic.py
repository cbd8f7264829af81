"""Pythonic tool calls (Llama 3.2/4 style): ``[get_weather(city="Paris"), add(a=1, b=2)]``.

Parsed with ``ast`` and ``ast.literal_eval`` on each argument: literals only, nothing is
evaluated. Positional arguments are bound by the tool schemas' parameter order
(``tool_parameters``) when ``parse`` gets the schemas.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from typing import Any

from trainer_client.parsers.decode import literal, parse_python, strip_fences
from trainer_client.parsers.tags import find_answer
from trainer_client.parsers.types import ParsedCall, ParseOutcome, Tools
from trainer_client.parsers.values import check_call, printable

__all__ = ["PythonicParser", "tool_parameters"]


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


class PythonicParser:
    """Pythonic calls: a turn whose text starts with ``[name(`` is a call list.

    It must end with the closing ``]`` (an unclosed list is reported, as an unclosed
    ``<tool_call>`` is in hermes). A plain list such as ``[1, 2]`` is an ordinary reply.
    Positional arguments are bound to the parameters in schema order when ``parse`` gets
    the tool schemas, and are an error otherwise.
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
        body = strip_fences(body)
        if not body.startswith("["):
            return outcome
        looks_like_calls = self._CALL_LIST_RE.match(body) is not None
        try:
            tree: ast.expr | None = parse_python(body)
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
            return f"list item {printable(ast.unparse(node))!r} is not a call; {self._EXPECTED}"
        name = _dotted_name(node.func)
        if name is None:
            return f"{printable(ast.unparse(node.func))!r} is not a tool name; {self._EXPECTED}"
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
                arguments[keyword.arg] = literal(keyword.value)
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
                bound[parameter] = literal(node)
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
