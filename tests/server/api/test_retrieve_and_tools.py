"""Library tools behind the real server: Search-R1 /retrieve, search/python/sql over both MCP and /v1/calls."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import httpx
import orjson
import pytest
from mcp import Client

from protocol import decode_results
from tests.support.server import ServerProcess, running_server, server_config

DOCS = [
    {
        "id": "d1",
        "title": "Ada Lovelace",
        "contents": "Ada Lovelace wrote the first published computer program.",
    },
    {
        "id": "d2",
        "title": "Alan Turing",
        "contents": "Alan Turing formalised computation with the Turing machine.",
    },
    {
        "id": "d3",
        "title": "Grace Hopper",
        "contents": "Grace Hopper built the first compiler for a programming language.",
    },
]


@pytest.fixture(scope="module")
def library_server(tmp_path_factory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("corpus")
    corpus = tmp / "docs.jsonl"
    corpus.write_bytes(b"\n".join(orjson.dumps(d) for d in DOCS))
    config = server_config()
    config["tools"] = config["tools"] + [
        {
            "target": "tools.search:SearchTool",
            "toolsets": ["default"],
            "args": {"corpus": str(corpus), "cache_dir": str(tmp / "cache")},
        },
        {"target": "tools.python_tool:PythonTool", "toolsets": ["default"], "args": {"pool_size": 1}},
        {"target": "tools.sql:SqlTool", "toolsets": ["default"]},
    ]
    with running_server(config, env={"TOOLFACTORY_CACHE": str(tmp / "cache")}) as proc:
        yield proc


def test_retrieve_is_search_r1_compatible(library_server):
    url = library_server.url + "/retrieve"
    body = httpx.post(
        url, json={"queries": ["compiler", "Turing machine"], "topk": 2, "return_scores": True}
    ).json()
    assert len(body["result"]) == 2
    first = body["result"][0][0]
    assert first["document"]["id"] == "d3"
    assert first["document"]["contents"].startswith('"Grace Hopper"\n')
    assert isinstance(first["score"], float)
    plain = httpx.post(url, json={"queries": ["Ada"], "topk": 1}).json()
    assert set(plain["result"][0][0]) == {"id", "contents"}
    bad = httpx.post(url, json={"queries": "not a list"})
    assert bad.status_code == 400 and "list of strings" in bad.json()["error"]["message"]
    bad_topk = httpx.post(url, json={"queries": ["x"], "topk": 0})
    assert bad_topk.status_code == 400


def test_python_sessions_over_http_batch(library_server):
    session = f"traj-{uuid.uuid4().hex}"

    def call(code: str) -> dict:
        body = {
            "calls": [
                {
                    "call_id": uuid.uuid4().hex,
                    "name": "python",
                    "arguments": {"code": code},
                    "session": session,
                }
            ]
        }
        return decode_results(httpx.post(library_server.url + "/v1/calls", json=body, timeout=60).content)[0]

    assert not call("x = 21").is_error
    result = call("print(x * 2)")
    assert "42" in result.text
    assert httpx.delete(f"{library_server.url}/v1/sessions/{session}").status_code == 200
    after = call("print(x)")  # a released session is not revived by a late call
    assert after.is_error and after.error.kind == "unknown_session"


def test_library_tools_over_mcp(library_server):
    async def scenario():
        async with Client(library_server.url + "/mcp", mode="2026-07-28") as client:
            names = {t.name for t in (await client.list_tools()).tools}
            search = await client.call_tool("search", {"query": "first compiler", "topk": 1})
            session = {"toolfactory/session": f"mcp-{uuid.uuid4().hex}"}
            await client.call_tool("python", {"code": "y = 6 * 7"}, meta=session)
            python = await client.call_tool("python", {"code": "y"}, meta=session)
            sql = await client.call_tool("sql", {"query": "SELECT 1 + 1 AS two"})
            return names, search, python, sql

    names, search, python, sql = asyncio.run(scenario())
    assert {"search", "python", "sql", "calculator"} <= names
    assert not search.is_error and "Grace Hopper" in search.content[0].text
    assert "42" in python.content[0].text
    assert not sql.is_error and "2" in sql.content[0].text
