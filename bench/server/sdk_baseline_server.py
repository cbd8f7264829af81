"""The MCP SDK's own low-level server with one trivial tool: the baseline our MCP path is compared to.

Run as ``python bench/server/sdk_baseline_server.py PORT``; stateless, JSON responses, like ours.
Like ours (and like the SDK's own high-level ``MCPServer``), it answers the SDK's
``get_tool_input_schema`` lookup; without it the SDK runs a whole ``tools/list`` on every
``tools/call`` to check ``Mcp-Param`` headers, which costs about a third of a call.
"""

from __future__ import annotations

import json
import sys

import mcp_types as types
import uvicorn
from mcp.server.lowlevel import Server

# The same tool as ours: tools.testing.echo's input schema (as our registry derives it)
# and its output, {"text": ..., "data": ...}, as content text and structured content.
ECHO = types.Tool(
    name="echo",
    description="Return the arguments unchanged (a trivial tool for tests and benchmarks).",
    input_schema={
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "text": {
                "type": "string",
                "default": "",
                "title": "Text",
                "description": "Text to return unchanged.",
            },
            "data": {
                "anyOf": [{"type": "object", "additionalProperties": True}, {"type": "null"}],
                "default": None,
                "title": "Data",
                "description": "Any JSON object; returned as structured output.",
            },
        },
    },
)


async def list_tools(ctx, params) -> types.ListToolsResult:  # type: ignore[no-untyped-def]
    return types.ListToolsResult(tools=[ECHO])


async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:  # type: ignore[no-untyped-def]
    arguments = params.arguments or {}
    output = {"text": arguments.get("text", ""), "data": arguments.get("data")}
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(output))], structured_content=output
    )


def main() -> None:
    server = Server(
        "sdk-baseline",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        get_tool_input_schema=lambda name: ECHO.input_schema if name == "echo" else None,
    )
    app = server.streamable_http_app(stateless_http=True, json_response=True)
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
