"""Search-R1 compatible ``POST /retrieve``, served by a configured search tool.

Request ``{"queries": [...], "topk": 3, "return_scores": true}``; response
``{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}`` where
``contents`` is ``"Title"\\ntext`` as in Search-R1's own retriever, so existing
Search-R1 code can point at this server unchanged.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from protocol import Call, ErrorKind, new_call_id
from tool_server.api.routes import HttpApi, error_response, json_response
from tool_server.executor.executor import Executor, Overloaded

MAX_QUERIES = 4096


class RetrieveEndpoint:
    def __init__(self, executor: Executor, api: HttpApi, tool: str, default_topk: int) -> None:
        self.executor = executor
        self.api = api
        self.tool = tool
        self.default_topk = default_topk

    async def handle(self, request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return error_response(400, ErrorKind.BAD_REQUEST, f"body is not valid JSON: {exc}")
        if not isinstance(body, dict):
            return error_response(400, ErrorKind.BAD_REQUEST, 'body must be an object with "queries"')
        queries = body.get("queries")
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            return error_response(400, ErrorKind.BAD_REQUEST, '"queries" must be a list of strings')
        if len(queries) > MAX_QUERIES:
            return error_response(413, ErrorKind.TOO_LARGE, f"at most {MAX_QUERIES} queries per request")
        topk = body.get("topk", self.default_topk)
        if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= 100:
            return error_response(400, ErrorKind.BAD_REQUEST, '"topk" must be an integer from 1 to 100')
        return_scores = body.get("return_scores", False)
        if not queries:
            return json_response({"result": []})
        call = Call(new_call_id(), self.tool, {"query": queries, "topk": topk})
        try:
            (result,) = await self.executor.run_batch([call], self.api.caller(request.scope))
        except Overloaded as exc:
            return error_response(429, ErrorKind.OVERLOADED, str(exc), {"Retry-After": self.api.retry_after})
        if result.is_error:
            status = 401 if result.error and result.error.kind == ErrorKind.UNAUTHORIZED else 503
            return error_response(status, result.error.kind if result.error else "tool_error", result.text)
        per_query: list[list[dict[str, Any]]] = (result.structured or {}).get("results", [])
        return json_response(
            {"result": [[_document(hit, return_scores) for hit in hits] for hits in per_query]}
        )


def _document(hit: dict[str, Any], return_scores: bool) -> dict[str, Any]:
    document = {
        "id": str(hit.get("id", "")),
        "contents": f'"{hit.get("title", "")}"\n{hit.get("contents", "")}',
    }
    return {"document": document, "score": float(hit.get("score", 0.0))} if return_scores else document
