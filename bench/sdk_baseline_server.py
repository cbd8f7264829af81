"""The MCP SDK's own low-level server with one trivial tool: the baseline our MCP path is compared to.

Run as ``python bench/sdk_baseline_server.py PORT``; stateless, JSON responses, like ours.
Like ours (and like the SDK's own high-level ``MCPServer``), it answers the SDK's
``get_tool_input_schema`` lookup; without it the SDK runs a whole ``tools/list`` on every
``tools/call`` to check ``Mcp-Param`` headers, which costs about a third of a call.
"""

from __future__ import annotations

import sys

import mcp_types as types
import uvicorn
from mcp.server.lowlevel import Server

ECHO = types.Tool(
    name="echo",
    description="Return the text unchanged.",
    input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
)


async def list_tools(ctx, params) -> types.ListToolsResult:  # type: ignore[no-untyped-def]
    return types.ListToolsResult(tools=[ECHO])


async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:  # type: ignore[no-untyped-def]
    text = (params.arguments or {}).get("text", "")
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content={"text": text}
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
