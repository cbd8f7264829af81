"""A stdio MCP server (official SDK) whose tools publish hostile ``pattern`` schemas, for the ReDoS tests.

* ``code(value)``: ``value`` has ``pattern: ^(a+)+$``, which a backtracking engine takes
  2^n steps to reject for ``"a" * n + "!"``;
* ``tagged(labels)``: ``labels`` keys must match ``patternProperties`` ``^(x+)+$`` (the same
  trap, in a property name), no other key allowed;
* ``ahead(value)``: ``pattern: ^(?=a)a+$``, a lookahead, which a linear-time engine cannot run;
* ``word(n)``: answers ``{"value": "a" * n + "!"}`` while its ``outputSchema`` says
  ``value`` has ``pattern: ^(a+)+$`` (the MCP client checks results against it);
* ``peek()``: an ``outputSchema`` with a lookahead.

Each tool answers with what it got (the server forwards only arguments it has checked).

Run: ``python tests/support/pattern_upstream.py``.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel

server = MCPServer("patterns")


@server.tool(description="The length of a code made of a's.")
def code(value: str) -> int:
    return len(value)


@server.tool(description="How many labels it got.")
def tagged(labels: dict[str, int]) -> int:
    return len(labels)


@server.tool(description="A pattern with a lookahead.")
def ahead(value: str) -> str:
    return value


class Word(BaseModel):
    value: str


@server.tool(description="A word of n a's and a '!'.")
def word(n: int) -> Word:
    return Word(value="a" * n + "!")


@server.tool(description="An output schema with a lookahead.")
def peek() -> Word:
    return Word(value="a")


def _publish(name: str, properties: dict[str, Any]) -> None:
    """Publish ``properties`` as the tool's inputSchema (the SDK derives one from the signature)."""
    schema = {"type": "object", "properties": properties, "required": list(properties)}
    server._tool_manager.get_tool(name).parameters = schema  # type: ignore[union-attr]


_publish("code", {"value": {"type": "string", "pattern": "^(a+)+$"}})
_publish(
    "tagged",
    {
        "labels": {
            "type": "object",
            "patternProperties": {"^(x+)+$": {"type": "integer"}},
            "additionalProperties": False,
        }
    },
)
_publish("ahead", {"value": {"type": "string", "pattern": "^(?=a)a+$"}})
for _name, _pattern in (("word", "^(a+)+$"), ("peek", "^(?=a)")):
    server._tool_manager.get_tool(_name).fn_metadata.output_schema = {  # type: ignore[union-attr]
        "type": "object",
        "properties": {"value": {"type": "string", "pattern": _pattern}},
        "required": ["value"],
    }


if __name__ == "__main__":
    server.run()
