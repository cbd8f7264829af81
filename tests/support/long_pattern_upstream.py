"""A stdio MCP server (official SDK) whose tools publish patterns of 1.4 MB, for the pattern-size tests.

Python's ``re`` parses such a pattern for seconds (25 s for one in the attack that found it),
holding the GIL; jsonschema's ``check_schema`` did so for each, on the event loop.

* ``long_input_1``, ``long_input_2``: an argument with a 1.4 MB ``pattern``;
* ``long_key_1``, ``long_key_2``: a ``patternProperties`` key of 1.4 MB;
* ``long_output_1``, ``long_output_2``: an ``outputSchema`` with a 1.4 MB ``pattern``;
* ``short(word)``: a short pattern in and out.

Each answers ``{"value": word}``. Run: ``python tests/support/long_pattern_upstream.py``.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel

LONG = "|".join(f"w{i:06d}" for i in range(175_000))  # 1,399,999 characters
SHORT = "^[a-z]+$"

server = MCPServer("long")


class Word(BaseModel):
    value: str


def echo(word: str) -> Word:
    """Echo a word."""
    return Word(value=word)


def _schemas(name: str, argument: dict[str, Any], output_pattern: str) -> None:
    server.add_tool(echo, name=name)
    tool = server._tool_manager.get_tool(name)
    assert tool is not None
    tool.parameters = {"type": "object", **argument}
    tool.fn_metadata.output_schema = {
        "type": "object",
        "properties": {"value": {"type": "string", "pattern": output_pattern}},
        "required": ["value"],
    }


_schemas("short", {"properties": {"word": {"type": "string", "pattern": SHORT}}}, SHORT)
for _n in (1, 2):
    _schemas(f"long_input_{_n}", {"properties": {"word": {"type": "string", "pattern": LONG}}}, SHORT)
    _schemas(f"long_key_{_n}", {"patternProperties": {LONG: {"type": "string"}}}, SHORT)
    _schemas(f"long_output_{_n}", {"properties": {"word": {"type": "string"}}}, LONG)


if __name__ == "__main__":
    server.run()
