"""The tool server: MCP endpoint, batched HTTP API, executor, registry."""

from protocol.moved import redirect

# Old module paths (before the sub-packages), importable with a DeprecationWarning.
redirect(
    {
        "tool_server.auth": "tool_server.api.auth",
        "tool_server.connections": "tool_server.api.connections",
        "tool_server.executor_admission": "tool_server.executor.admission",
        "tool_server.executor_order": "tool_server.executor.order",
        "tool_server.executor_output": "tool_server.executor.output",
        "tool_server.executor_records": "tool_server.executor.records",
        "tool_server.executor_runner": "tool_server.executor.runner",
        "tool_server.fair_slots": "tool_server.executor.fair_slots",
        "tool_server.http_api": "tool_server.api.routes",
        "tool_server.mcp_endpoint": "tool_server.api.mcp",
        "tool_server.openapi": "tool_server.api.openapi",
        "tool_server.retrieve": "tool_server.api.retrieve",
        "tool_server.upstream_calls": "tool_server.upstream.calls",
        "tool_server.upstream_config": "tool_server.upstream.config",
        "tool_server.upstream_server": "tool_server.upstream.server",
        "tool_server.upstream_sessions": "tool_server.upstream.sessions",
        "tool_server.upstream_stderr": "tool_server.upstream.stderr",
        "tool_server.upstream_stdio": "tool_server.upstream.stdio",
        "tool_server.upstream_supervisor": "tool_server.upstream.supervisor",
        "tool_server.upstream_tools": "tool_server.upstream.tools",
        "tool_server.upstream_transport": "tool_server.upstream.transport",
        "tool_server.workbench_envs": "tool_server.workbench.envs",
        "tool_server.workbench_files": "tool_server.workbench.files",
        "tool_server.workbench_live": "tool_server.workbench.live",
        "tool_server.workbench_runs": "tool_server.workbench.runs",
        "tool_server.workbench_tb": "tool_server.workbench.tensorboard",
        "tool_server.workbench_tokens": "tool_server.workbench.tokens",
    }
)
