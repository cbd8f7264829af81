"""The tool server: MCP endpoint, batched HTTP API, executor, registry."""
