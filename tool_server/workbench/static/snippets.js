// Copyable ways to make the same call elsewhere: /v1/calls with curl, the MCP SDK, an mcpServers block.

function python(value, indent = "") {
  if (value === null || value === undefined) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (typeof value === "number" || typeof value === "string") return JSON.stringify(value);
  const inner = indent + "    ";
  if (Array.isArray(value)) {
    if (!value.length) return "[]";
    return `[\n${value.map((v) => inner + python(v, inner)).join(",\n")},\n${indent}]`;
  }
  const entries = Object.entries(value);
  if (!entries.length) return "{}";
  return `{\n${entries.map(([k, v]) => `${inner}${JSON.stringify(k)}: ${python(v, inner)}`).join(",\n")},\n${indent}}`;
}

const shellQuote = (text) => `'${text.replace(/'/g, `'\\''`)}'`;

export function curlSnippet(origin, call, tokenRequired) {
  const body = JSON.stringify({ calls: [call] });
  return [
    `curl -sS ${origin}/v1/calls \\`,
    `  -H 'Content-Type: application/json' \\`,
    tokenRequired ? `  -H "Authorization: Bearer $TOOLFACTORY_TOKEN" \\` : null,
    `  -d ${shellQuote(body)}`,
  ].filter(Boolean).join("\n");
}

export function mcpSnippet(url, name, args, tokenRequired) {
  const headers = tokenRequired ? `headers={"Authorization": f"Bearer {os.environ['TOOLFACTORY_TOKEN']}"}` : "";
  return `import asyncio${tokenRequired ? "\nimport os" : ""}

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


async def main() -> None:
    http = httpx2.AsyncClient(${headers})
    async with http, Client(streamable_http_client(${JSON.stringify(url)}, http_client=http)) as client:
        result = await client.call_tool(${JSON.stringify(name)}, ${python(args, "        ")})
        print(result.content, result.structured_content)


asyncio.run(main())
`;
}

export function mcpServersSnippet(url, toolset, tokenRequired) {
  const entry = { type: "http", url };
  if (tokenRequired) entry.headers = { Authorization: "Bearer <your token>" };
  return JSON.stringify({ mcpServers: { [`toolfactory-${toolset || "default"}`]: entry } }, null, 2);
}
